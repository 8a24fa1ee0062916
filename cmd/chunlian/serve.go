package main

// serve.go: `chunlian serve` — the HTTP service on the whole stack.
//
// Start-up order: validate all flags → listen (so /health answers and /ready
// says 503 while the model loads) → build the stack → attach it → one
// warm-up generation → /ready 200. SIGINT/SIGTERM: /ready 503, stop
// accepting, drain in-flight requests up to --drain-timeout, close the
// engine, exit 0.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"chunlian/forward"
	"chunlian/server"
)

func init() {
	commands["serve"] = command{
		summary: "run the HTTP service (web page, API, metrics) on 127.0.0.1:8000",
		run: func(args []string) error {
			sig := make(chan os.Signal, 2) // two: a quick second signal (forced exit) is not dropped
			signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sig)
			err := serveMain(args, sig, nil)
			if errors.Is(err, errLogged) {
				os.Exit(1) // already in the JSON log
			}
			return err
		},
	}
}

// errLogged marks an error that serveMain has already logged as JSON
// (--log-format json: nothing but JSON lines on stderr).
var errLogged = errors.New("logged")

// serveConfig is the stack config plus the HTTP layer's flags.
type serveConfig struct {
	stack          stackConfig
	Addr           string
	APIKey         string
	CORSOrigin     string // comma-separated
	RequestTimeout time.Duration
	DrainTimeout   time.Duration
	DrainDelay     time.Duration // /ready 503 while still serving, before the listener closes
	MaxInFlight    int           // 0 = max-num-seqs + max-queue
	Pprof          bool
	LogLevel       string
	LogFormat      string
}

func (c *serveConfig) register(fs *flag.FlagSet) {
	c.stack.register(fs)
	c.Addr, c.LogLevel, c.LogFormat = "127.0.0.1:8000", "info", "text"
	c.RequestTimeout, c.DrainTimeout = 60*time.Second, 30*time.Second
	env := &c.stack
	env.envString("CHUNLIAN_ADDR", &c.Addr)
	env.envString("CHUNLIAN_API_KEY", &c.APIKey)
	env.envString("CHUNLIAN_CORS_ORIGIN", &c.CORSOrigin)
	env.envString("CHUNLIAN_LOG_LEVEL", &c.LogLevel)
	env.envString("CHUNLIAN_LOG_FORMAT", &c.LogFormat)
	env.envInt("CHUNLIAN_MAX_IN_FLIGHT", &c.MaxInFlight)
	env.envBool("CHUNLIAN_PPROF", &c.Pprof)
	envDuration(env, "CHUNLIAN_REQUEST_TIMEOUT", &c.RequestTimeout)
	envDuration(env, "CHUNLIAN_DRAIN_TIMEOUT", &c.DrainTimeout)
	envDuration(env, "CHUNLIAN_DRAIN_DELAY", &c.DrainDelay)

	fs.StringVar(&c.Addr, "addr", c.Addr, "listen address host:port (port 0 = any free port) [CHUNLIAN_ADDR]")
	fs.StringVar(&c.APIKey, "api-key", c.APIKey, "if set, the API (/generate, /v1/*) requires 'Authorization: Bearer KEY'; the web page, /health, /ready, /metrics stay open [CHUNLIAN_API_KEY]")
	fs.StringVar(&c.CORSOrigin, "cors-origin", c.CORSOrigin, "comma-separated browser origins allowed by CORS (* = any); empty = CORS off [CHUNLIAN_CORS_ORIGIN]")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", c.RequestTimeout, "per-request generation deadline (0 = none); past it: HTTP 504 [CHUNLIAN_REQUEST_TIMEOUT]")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "on SIGTERM/SIGINT, how long in-flight requests may finish [CHUNLIAN_DRAIN_TIMEOUT]")
	fs.DurationVar(&c.DrainDelay, "drain-delay", c.DrainDelay, "on SIGTERM/SIGINT, how long /ready says 503 while requests are still served, before the listener closes (let the balancer's readiness check notice; e.g. 5s behind Kubernetes); a second signal exits at once [CHUNLIAN_DRAIN_DELAY]")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "serve Go runtime profiles under /debug/pprof/ (CPU profile: /debug/pprof/profile?seconds=10); needs --api-key's key when one is set [CHUNLIAN_PPROF]")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", c.MaxInFlight, "max concurrent generation requests in the HTTP layer (0 = max-num-seqs + max-queue); beyond: 503 [CHUNLIAN_MAX_IN_FLIGHT]")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error [CHUNLIAN_LOG_LEVEL]")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json [CHUNLIAN_LOG_FORMAT]")
}

func envDuration(c *stackConfig, name string, dst *time.Duration) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		c.envErrs = append(c.envErrs, fmt.Errorf("%s=%q: not a duration (e.g. 30s)", name, v))
		return
	}
	*dst = d
}

func (c *serveConfig) logger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	o := &slog.HandlerOptions{Level: lvl}
	switch c.LogFormat {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", c.LogFormat)
}

// serverConfig validates the HTTP flags and converts them.
func (c *serveConfig) serverConfig(log *slog.Logger) (server.Config, error) {
	var errs []error
	if _, port, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("--addr %q: want host:port, e.g. 127.0.0.1:8000", c.Addr))
	} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		errs = append(errs, fmt.Errorf("--addr %q: bad port", c.Addr))
	}
	var origins []string
	for _, o := range strings.Split(c.CORSOrigin, ",") {
		if o = strings.TrimSpace(o); o != "" {
			origins = append(origins, o)
		}
	}
	inflight := c.MaxInFlight
	if inflight == 0 {
		inflight = c.stack.MaxNumSeqs + c.stack.MaxQueue
	}
	sc := server.Config{
		APIKey: c.APIKey, CORSOrigins: origins, RequestTimeout: c.RequestTimeout,
		DrainTimeout: c.DrainTimeout, DrainDelay: c.DrainDelay, MaxInFlight: inflight, Pprof: c.Pprof, Logger: log,
	}
	if c.DrainTimeout == 0 {
		errs = append(errs, errors.New("--drain-timeout 0: must be > 0"))
	}
	if err := sc.Validate(); err != nil {
		errs = append(errs, err)
	}
	return sc, errors.Join(errs...)
}

// serveMain runs the service until a signal arrives on sig. onListen, if
// set, gets the bound address (tests listen on port 0).
func serveMain(args []string, sig <-chan os.Signal, onListen func(addr string)) (err error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var cfg serveConfig
	cfg.register(fs)
	if err := fs.Parse(args); err != nil {
		return err // flag.ErrHelp after -h: main exits 0
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (all options are flags)", fs.Args())
	}
	log, err := cfg.logger()
	if err != nil {
		return err
	}
	if cfg.LogFormat == "json" {
		defer func() {
			if err != nil {
				log.Error("exiting", "err", err.Error())
				err = fmt.Errorf("%w: %w", errLogged, err)
			}
		}()
	}
	sc, err := cfg.serverConfig(log)
	if err = errors.Join(err, cfg.stack.Validate()); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	srv, err := server.New(sc)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	addr := ln.Addr().String()
	if onListen != nil {
		onListen(addr)
	}
	log.Info("serving; loading the model", "url", "http://"+addr+"/", "dashboard", "http://"+addr+"/dashboard")

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		select {
		case s := <-sig:
			log.Info("signal received, shutting down", "signal", s.String())
			stop()
		case <-ctx.Done():
		}
		if s, ok := <-sig; ok { // a second signal: no drain
			log.Warn("second signal: exiting without draining", "signal", s.String())
			srv.Close()
		}
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()

	// Load and warm up while already listening.
	stackCfg := cfg.stack
	stackCfg.wrapEngine = srv.Metrics().InstrumentEngine
	stackCfg.logger = log
	type built struct {
		st  *stack
		err error
	}
	loaded := make(chan built, 1)
	go func() {
		t0 := time.Now()
		st, err := buildStack(stackCfg)
		if err == nil {
			name := st.Model.Name
			if name == "" {
				name = "chunlian"
			}
			srv.Attach(server.Backend{Generator: st.Gen, Stats: st.Engine.Stats, ModelName: name, EngineName: stackCfg.Engine,
				GPU: gpuHook(st)}) // gpuHook: stack_cuda.go
			log.Info("model loaded", "model", name, "engine", stackCfg.Engine, "backend", stackCfg.Backend,
				"kv_blocks", st.Backend.NumBlocks(), "block_size", st.Backend.BlockSize(), "s", time.Since(t0).Seconds())
			if cb, ok := st.Backend.(*forward.CPU); ok {
				log.Info("cpu kernels", "kernels", cb.Kernels()) // why a machine is slow, in one line
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			err = srv.Warmup(wctx)
			cancel()
		}
		loaded <- built{st, err}
	}()

	var st *stack
	select {
	case b := <-loaded:
		st = b.st
		if b.err != nil {
			stop()
			<-served
			if st != nil {
				st.Close()
			}
			return b.err
		}
		log.Info("ready", "url", "http://"+addr+"/")
	case err := <-served: // signal before the model finished loading
		return err
	}
	err = <-served
	if cerr := st.Close(); cerr != nil {
		log.Warn("closing the stack", "err", cerr)
	}
	return err
}
