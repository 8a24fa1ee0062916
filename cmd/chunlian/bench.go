package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"chunlian/bench"
)

// newBenchCmd builds `chunlian bench`; the Markdown report goes to stdout
// unless --out is given.
func newBenchCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench (--url URL[,…] | --spawn engine,naive) [flags]",
		Short: "load-test a couplet service (ours or any compatible one) and write the report",
		Long: `Load-test a couplet service, closed loop (--concurrency) or open loop (--rate),
and write a Markdown report (plus JSON and plots on request). --url
measures running services; --spawn starts our own one after the other on
free loopback ports. A --url that does not answer fails at once.`,
		Example: "  chunlian bench --url http://127.0.0.1:8000 --concurrency 1,10,50\n  chunlian bench --spawn engine,naive --duration 20s --out report.md",
		Args:    noArgs,
	}
	run := defineBench(cmd.Flags(), stdout)
	cmd.RunE = func(*cobra.Command, []string) error { return run() }
	return withEnv(cmd)
}

// runBench parses args as `chunlian bench` would and runs it.
func runBench(args []string, stdout io.Writer) error {
	return execute(newBenchCmd(stdout), args)
}

// defineBench registers bench's flags on fs and returns the run.
func defineBench(fs *pflag.FlagSet, stdout io.Writer) func() error {
	var (
		urls        = fs.String("url", "", "service base URL(s) to measure, comma-separated, each optionally NAME=URL (e.g. naive=http://127.0.0.1:8001,engine=http://127.0.0.1:8000)")
		api         = fs.String("api", bench.APIGenerate, "request API: generate (POST /generate) or openai (POST /v1/completions)")
		model       = fs.String("api-model", "", "model field for --api openai")
		spawn       = fs.String("spawn", "", "start our own service in these modes one after the other on free loopback ports: engine,naive")
		serverFlags = fs.String("server-flags", "", "extra flags for every spawned 'chunlian serve' (split on spaces)")
		readyTO     = fs.Duration("ready-timeout", 3*time.Minute, "how long a spawned server may take to answer /ready")
		serverLogs  = fs.String("server-log-dir", "", "directory for spawned servers' logs (default: the temp dir)")
		conc        = fs.String("concurrency", "1,10,20,50,100", "closed-loop levels: concurrent users (default used unless only --rate is given)")
		rates       = fs.String("rate", "", "open-loop levels: Poisson arrival rates in req/s, e.g. 5,10,20")
		duration    = fs.Duration("duration", 10*time.Second, "measured window per level (with --requests: the level's time cap)")
		warmup      = fs.Duration("warmup", 2*time.Second, "warm-up per level, not counted")
		requests    = fs.Int("requests", 0, "counted requests per level instead of a fixed duration")
		modes       = fs.String("modes", "keyword", "request modes to mix: keyword,acrostic,lower")
		seed        = fs.Uint64("seed", 1, "seed for prompts, sampling seeds and arrivals")
		unseeded    = fs.Bool("unseeded", false, "send no sampling seed (the server draws one, as for a page's requests); prompts and arrivals still follow --seed")
		n           = fs.Int("n", 1, "couplets per request")
		maxTokens   = fs.Int("max-tokens", 0, "max_tokens for --api openai (0: server default)")
		stream      = fs.Bool("stream", false, "stream responses to measure TTFT and time per output token")
		timeout     = fs.Duration("timeout", 60*time.Second, "per-request timeout")
		allowRemote = fs.Bool("allow-remote", false, "allow non-loopback URLs (only hosts you may load-test)")
		maxRun      = fs.Duration("max-run", 30*time.Minute, "hard limit for the whole run (cap "+bench.MaxRun.String()+")")
		jsonPath    = fs.String("json", "", "write the full report as JSON to this file")
		outPath     = fs.String("out", "", "write the Markdown report to this file (default: stdout)")
		plotDir     = fs.String("plot-dir", "", "write latency/throughput plots (PNG and SVG) to this directory")
		quiet       = fs.Bool("quiet", false, "no progress display")
	)
	return func() error {
		set := map[string]bool{}
		fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
		return benchRun(benchFlags{urls, api, model, spawn, serverFlags, readyTO, serverLogs, conc, rates, duration, warmup,
			requests, modes, seed, unseeded, n, maxTokens, stream, timeout, allowRemote, maxRun, jsonPath, outPath, plotDir, quiet}, set, commandLine(fs), stdout)
	}
}

// benchFlags are bench's parsed flags.
type benchFlags struct {
	urls, api, model, spawn, serverFlags *string
	readyTO                              *time.Duration
	serverLogs, conc, rates              *string
	duration, warmup                     *time.Duration
	requests                             *int
	modes                                *string
	seed                                 *uint64
	unseeded                             *bool
	n, maxTokens                         *int
	stream                               *bool
	timeout                              *time.Duration
	allowRemote                          *bool
	maxRun                               *time.Duration
	jsonPath, outPath, plotDir           *string
	quiet                                *bool
}

// commandLine rebuilds the flags given (on the command line or from the
// environment) as a command line, for the report.
func commandLine(fs *pflag.FlagSet) string {
	var args []string
	fs.Visit(func(f *pflag.Flag) { args = append(args, "--"+f.Name+"="+f.Value.String()) })
	return quoteArgs(args)
}

func benchRun(f benchFlags, set map[string]bool, cmdline string, stdout io.Writer) error {
	cfg, err := benchConfig(f, set, cmdline)
	if err != nil {
		return err
	}

	// Ctrl-C / SIGTERM end the run; Run then returns the partial report.
	// After it returns, stop() restores default handling so a second Ctrl-C
	// kills at once while the report is being written.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	rep, err := bench.Run(ctx, cfg)
	stop()
	if err != nil {
		return err
	}
	return writeBenchReport(rep, f, stdout)
}

// benchConfig turns the parsed flags into the load tester's config (set:
// the flags given on the command line).
func benchConfig(f benchFlags, set map[string]bool, cmdline string) (bench.Config, error) {
	urls, api, model, spawn, serverFlags, readyTO, serverLogs, conc, rates := f.urls, f.api, f.model, f.spawn, f.serverFlags, f.readyTO, f.serverLogs, f.conc, f.rates
	duration, warmup, requests, modes, seed, n, maxTokens, stream, timeout := f.duration, f.warmup, f.requests, f.modes, f.seed, f.n, f.maxTokens, f.stream, f.timeout
	allowRemote, maxRun, quiet := f.allowRemote, f.maxRun, f.quiet
	var cfg bench.Config
	var err error
	if *rates != "" && !set["concurrency"] {
		*conc = "" // only open loop asked for
	}
	if cfg.Concurrency, err = parseInts(*conc); err != nil {
		return cfg, fmt.Errorf("--concurrency: %w", err)
	}
	if cfg.Rates, err = parseFloats(*rates); err != nil {
		return cfg, fmt.Errorf("--rate: %w", err)
	}
	if cfg.Modes, err = bench.ParseModes(*modes); err != nil {
		return cfg, fmt.Errorf("--modes: %w", err)
	}
	cfg.Duration, cfg.Warmup, cfg.Requests = *duration, *warmup, *requests
	if *requests > 0 && !set["duration"] {
		cfg.Duration = bench.MaxLevelDuration // only a cap when counting requests
	}
	cfg.Seed, cfg.N, cfg.MaxTokens, cfg.Stream, cfg.Timeout, cfg.Unseeded = *seed, *n, *maxTokens, *stream, *timeout, *f.unseeded
	cfg.AllowRemote, cfg.MaxRun, cfg.API = *allowRemote, *maxRun, *api
	cfg.ReadyTimeout, cfg.ServerLogDir = *readyTO, *serverLogs
	cfg.ServerFlags = strings.Fields(*serverFlags)
	cfg.Command = "chunlian bench " + cmdline

	switch {
	case *spawn != "" && *urls != "":
		return cfg, errors.New("give --url or --spawn, not both")
	case *spawn != "":
		for _, s := range strings.Split(*spawn, ",") {
			if s = strings.TrimSpace(s); s != "" {
				cfg.Spawn = append(cfg.Spawn, s)
			}
		}
		if cfg.ServerBin, err = os.Executable(); err != nil {
			return cfg, fmt.Errorf("--spawn: cannot find own binary: %w", err)
		}
	case *urls != "":
		if cfg.Targets, err = parseTargets(*urls, *api, *model); err != nil {
			return cfg, err
		}
	default:
		return cfg, usageError{"give --url or --spawn"}
	}

	if !*quiet {
		cfg.Progress = os.Stderr
		if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			cfg.ProgressBar = true // animated bar only on a terminal
		}
	}
	cfg.Log = os.Stderr
	return cfg, nil
}

// writeBenchReport writes rep where the flags ask (Markdown to --out or
// stdout, --json, --plots) and fails when a target could not be measured
// or the run was interrupted.
func writeBenchReport(rep *bench.Report, f benchFlags, stdout io.Writer) error {
	jsonPath, outPath, plotDir := f.jsonPath, f.outPath, f.plotDir
	var md bytes.Buffer
	rep.WriteMarkdown(&md)
	if *plotDir != "" {
		files, err := rep.WritePlots(*plotDir)
		if err != nil {
			return fmt.Errorf("plots: %w", err)
		}
		fmt.Fprintf(os.Stderr, "bench: wrote %d plot files to %s\n", len(files), *plotDir)
	}
	if *jsonPath != "" {
		if err := writeFile(*jsonPath, rep.WriteJSON); err != nil {
			return err
		}
	}
	if *outPath != "" {
		if err := os.WriteFile(*outPath, md.Bytes(), 0o644); err != nil {
			return err
		}
	} else {
		stdout.Write(md.Bytes())
	}
	var failed []string
	for _, t := range rep.Targets {
		if t.Error != "" {
			failed = append(failed, t.Name)
		}
	}
	switch {
	case rep.Interrupted != "":
		return fmt.Errorf("%s: partial report written", rep.Interrupted)
	case len(failed) > 0:
		return fmt.Errorf("could not measure %s (see report)", strings.Join(failed, ", "))
	}
	return nil
}

// parseTargets reads "URL" or "NAME=URL,NAME=URL".
func parseTargets(s, api, model string) ([]bench.Target, error) {
	var ts []bench.Target
	parts := strings.Split(s, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		name, u, ok := strings.Cut(p, "=")
		if !ok || strings.Contains(name, "/") {
			name, u = "target", p
			if len(parts) > 1 {
				name = fmt.Sprintf("target%d", i+1)
			}
		}
		ts = append(ts, bench.Target{Name: name, URL: u, API: api, Model: model})
	}
	if len(ts) == 0 {
		return nil, errors.New("--url: no URL")
	}
	return ts, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'`$") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
