package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"chunlian/bench"
)

func init() {
	commands["bench"] = command{
		summary: "load-test a couplet service (ours or any compatible one) and write the report",
		run:     runBench,
	}
}

func runBench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var (
		urls        = fs.String("url", "", "service base URL(s) to measure, comma-separated, each optionally NAME=URL (e.g. naive=http://127.0.0.1:8001,engine=http://127.0.0.1:8000)")
		api         = fs.String("api", bench.APIGenerate, "request API: generate (POST /generate) or openai (POST /v1/completions)")
		model       = fs.String("model", "", "model field for --api openai")
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
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: chunlian bench (--url URL[,…] | --spawn engine,naive) [flags]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err // flag.ErrHelp after -h: main exits 0
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var cfg bench.Config
	var err error
	if *rates != "" && !set["concurrency"] {
		*conc = "" // only open loop asked for
	}
	if cfg.Concurrency, err = parseInts(*conc); err != nil {
		return fmt.Errorf("--concurrency: %w", err)
	}
	if cfg.Rates, err = parseFloats(*rates); err != nil {
		return fmt.Errorf("--rate: %w", err)
	}
	if cfg.Modes, err = bench.ParseModes(*modes); err != nil {
		return fmt.Errorf("--modes: %w", err)
	}
	cfg.Duration, cfg.Warmup, cfg.Requests = *duration, *warmup, *requests
	if *requests > 0 && !set["duration"] {
		cfg.Duration = bench.MaxLevelDuration // only a cap when counting requests
	}
	cfg.Seed, cfg.N, cfg.MaxTokens, cfg.Stream, cfg.Timeout = *seed, *n, *maxTokens, *stream, *timeout
	cfg.AllowRemote, cfg.MaxRun, cfg.API = *allowRemote, *maxRun, *api
	cfg.ReadyTimeout, cfg.ServerLogDir = *readyTO, *serverLogs
	cfg.ServerFlags = strings.Fields(*serverFlags)
	cfg.Command = "chunlian bench " + quoteArgs(args)

	switch {
	case *spawn != "" && *urls != "":
		return errors.New("give --url or --spawn, not both")
	case *spawn != "":
		for _, s := range strings.Split(*spawn, ",") {
			if s = strings.TrimSpace(s); s != "" {
				cfg.Spawn = append(cfg.Spawn, s)
			}
		}
		if cfg.ServerBin, err = os.Executable(); err != nil {
			return fmt.Errorf("--spawn: cannot find own binary: %w", err)
		}
	case *urls != "":
		if cfg.Targets, err = parseTargets(*urls, *api, *model); err != nil {
			return err
		}
	default:
		fs.Usage()
		return errors.New("give --url or --spawn")
	}

	if !*quiet {
		cfg.Progress = os.Stderr
		if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			cfg.ProgressBar = true // animated bar only on a terminal
		}
	}
	cfg.Log = os.Stderr

	// Ctrl-C / SIGTERM end the run; Run then returns the partial report.
	// After it returns, stop() restores default handling so a second Ctrl-C
	// kills at once while the report is being written.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	rep, err := bench.Run(ctx, cfg)
	stop()
	if err != nil {
		return err
	}

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
		os.Stdout.Write(md.Bytes())
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
