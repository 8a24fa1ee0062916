package main

// serve.go: `chunlian serve` — the HTTP service on the whole stack.
//
// Start-up order: validate all flags → listen (so /health answers and /ready
// says 503 while the model loads) → build the stack → attach it → one
// warm-up generation → /ready 200. SIGINT/SIGTERM: /ready 503, stop
// accepting, drain in-flight requests up to --drain-timeout, close the
// engine, exit 0.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"chunlian/forward"
	"chunlian/server"
)

// newServeCmd builds `chunlian serve`. sig delivers the shutdown signal
// (nil: SIGINT/SIGTERM); onListen, if set, gets the bound address (tests
// listen on port 0).
func newServeCmd(sig <-chan os.Signal, onListen func(addr string)) *cobra.Command {
	var cfg serveConfig
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "run the HTTP service (web page, API, metrics) on 127.0.0.1:8000",
		Long: `Run the HTTP service: the web page, the JSON API (/generate, /v1/*), the
dashboard and Prometheus metrics.

Start-up: validate all flags, listen (/health answers and /ready says 503
while the model loads), build the stack, warm up, /ready 200. On SIGINT or
SIGTERM: /ready 503 (still serving for --drain-delay), stop accepting,
drain in-flight requests up to --drain-timeout, exit 0; a second signal
exits at once.`,
		Example: "  chunlian serve\n  chunlian serve --addr 0.0.0.0:8000 --api-key $KEY\n  CHUNLIAN_BACKEND=cpu chunlian serve --threads 2",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sig == nil {
				ch := make(chan os.Signal, 2) // two: a quick second signal (forced exit) is not dropped
				signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
				defer signal.Stop(ch)
				sig = ch
			}
			cfg.admissionSet = cmd.Flags().Changed("admission")
			err := serveRun(cfg, sig, onListen)
			if errors.Is(err, errLogged) {
				os.Exit(1) // already in the JSON log
			}
			return err
		},
	}
	cfg.register(cmd.Flags())
	return withEnv(cmd)
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
	MaxInFlight    int           // 0 = the server's default
	Pprof          bool
	LogLevel       string
	LogFormat      string
	// Hardening (server.Config; 0 = the server's default).
	MaxConns          int
	ProbeReserveConns int
	WriteTimeout      time.Duration
	PublicMetrics     bool
	AdmissionFactor   float64
	OverloadFactor    float64       // admission's factor under overload (0 = the server's default)
	QueueTarget       time.Duration // admission's queueing-delay target (0 = the server's default)
	Admission         bool
	MemoryLimit       byteSize // 0 = sized from the loaded model
	GCPercent         int      // GOGC; 0 = the backend's default, -1 = off
	admissionSet      bool     // --admission given (flag or env): the CUDA default does not apply
}

func (c *serveConfig) register(fs *pflag.FlagSet) {
	c.stack.registerModel(fs)
	c.stack.registerEngine(fs)
	c.Addr, c.LogLevel, c.LogFormat = "127.0.0.1:8000", "info", "text"
	c.RequestTimeout, c.DrainTimeout = 60*time.Second, 30*time.Second
	fs.StringVar(&c.Addr, "addr", c.Addr, "listen address host:port (port 0 = any free port)")
	fs.StringVar(&c.APIKey, "api-key", c.APIKey, "if set, the API (/generate, /v1/*) requires 'Authorization: Bearer KEY'; the web page, /health, /ready, /metrics stay open")
	fs.StringVar(&c.CORSOrigin, "cors-origin", c.CORSOrigin, "comma-separated browser origins allowed by CORS (* = any); empty = CORS off")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", c.RequestTimeout, "per-request generation deadline (0 = none); past it: HTTP 504")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "on SIGTERM/SIGINT, how long in-flight requests may finish")
	fs.DurationVar(&c.DrainDelay, "drain-delay", c.DrainDelay, "on SIGTERM/SIGINT, how long /ready says 503 while requests are still served, before the listener closes (let the balancer's readiness check notice; e.g. 5s behind Kubernetes); a second signal exits at once")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "serve Go runtime profiles under /debug/pprof/ (CPU profile: /debug/pprof/profile?seconds=10); needs --api-key's key when one is set")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", c.MaxInFlight, "hard cap on concurrent generation requests in the HTTP layer (0 = 256); adaptive admission usually refuses earlier; beyond: 503")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	c.Admission = true
	fs.IntVar(&c.MaxConns, "max-conns", 0, fmt.Sprintf("client connections served at once (0 = %d, lowered to fit the open-file limit)", server.DefaultMaxConns))
	fs.IntVar(&c.ProbeReserveConns, "probe-reserve-conns", 0, "extra connections past --max-conns for /health and /ready only (0 = the server's default, 32)")
	fs.DurationVar(&c.WriteTimeout, "write-timeout", 0, "each response write must complete within it (0 = 30s)")
	fs.BoolVar(&c.PublicMetrics, "public-metrics", false, "leave /metrics and /api/stats open when --api-key is set")
	fs.BoolVar(&c.Admission, "admission", c.Admission, "adaptive, cost-aware admission (503 + Retry-After past the knee); false = only --max-in-flight and --max-queue limit load")
	fs.Float64Var(&c.AdmissionFactor, "admission-latency-factor", 0, "per-step latency over the unloaded one above which admission shrinks its budget (0 = 6)")
	fs.Float64Var(&c.OverloadFactor, "admission-overload-factor", 0, "the latency factor while admission sees overload (a standing queue): accepted requests then stay near it (0 = 1.75)")
	fs.DurationVar(&c.QueueTarget, "admission-queue-target", 0, "queueing delay that, standing for four times as long, means overload (0 = half the unloaded latency of a default request)")
	fs.IntVar(&c.GCPercent, "gc-percent", 0, "Go GC target percentage (GOGC): heap growth over the live heap that starts a collection; -1 = off (only --memory-limit starts one); 0 = the backend's default: the runtime's 100 on the CPU, off with CUDA (whose --memory-limit default has 2 GiB of headroom); the GOGC variable wins")
	fs.Var(&c.MemoryLimit, "memory-limit", "Go soft memory limit (GOMEMLIMIT), e.g. 600MiB; 0 = the live heap after loading plus max(256 MiB on the CPU, 2 GiB with CUDA; half of it); the GOMEMLIMIT variable wins")
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
	inflight := c.MaxInFlight // 0 = the server's default; admission adapts below it
	admissionOff := !c.Admission
	if c.stack.Backend == "cuda" {
		// The GPU batches thousands of sequences at a p99 far inside its
		// goal: the engine's own limits bound the load there, and the
		// CPU-sized defaults (256 in flight, latency-based admission) cut
		// its throughput by an order of magnitude (docs/DECISIONS.md,
		// "Admission"). Set flags win.
		if inflight == 0 {
			inflight = c.stack.MaxNumSeqs + c.stack.MaxQueue
		}
		admissionOff = admissionOff || !c.admissionSet
	}
	sc := server.Config{
		APIKey: c.APIKey, CORSOrigins: origins, RequestTimeout: c.RequestTimeout,
		DrainTimeout: c.DrainTimeout, DrainDelay: c.DrainDelay, MaxInFlight: inflight, Pprof: c.Pprof, Logger: log,
		MaxConns:          maxConnsForFDs(cmp.Or(c.MaxConns, server.DefaultMaxConns)), // stay under the open-file limit
		ProbeReserveConns: c.ProbeReserveConns, WriteTimeout: c.WriteTimeout, PublicMetrics: c.PublicMetrics,
		Admission: server.AdmissionConfig{LatencyFactor: c.AdmissionFactor, OverloadFactor: c.OverloadFactor, QueueTarget: c.QueueTarget, Disabled: admissionOff},
	}
	if c.DrainTimeout == 0 {
		errs = append(errs, errors.New("--drain-timeout 0: must be > 0"))
	}
	if err := sc.Validate(); err != nil {
		errs = append(errs, err)
	}
	return sc, errors.Join(errs...)
}

// serveMain parses args as `chunlian serve` would and runs the service
// until a signal arrives on sig (tests).
func serveMain(args []string, sig <-chan os.Signal, onListen func(addr string)) error {
	if sig == nil {
		sig = make(chan os.Signal)
	}
	return execute(newServeCmd(sig, onListen), args)
}

// serveRun runs the service on a parsed config until a signal arrives on
// sig.
func serveRun(cfg serveConfig, sig <-chan os.Signal, onListen func(addr string)) (err error) {
	log, err := cfg.logger()
	if err != nil {
		return err
	}
	if cfg.GCPercent < -1 {
		return fmt.Errorf("--gc-percent %d: want -1 (off), 0 (the backend's default) or a percentage", cfg.GCPercent)
	}
	cfg.stack.logger = log
	cfg.stack.Backend = cfg.stack.resolveBackend() // the HTTP defaults below depend on it
	cfg.stack.resolveLimits(cfg.stack.Backend)
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
	go watchSignals(ctx, stop, sig, srv, log)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()

	// Load and warm up while already listening.
	stackCfg := cfg.stack
	stackCfg.wrapEngine = srv.Metrics().InstrumentEngine
	stackCfg.logger = log
	loaded := make(chan built, 1)
	go func() {
		st, err := loadAndAttach(ctx, srv, stackCfg, log)
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
		// Model and KV cache are loaded: size GOMEMLIMIT from them.
		setMemoryLimit(log, int64(cfg.MemoryLimit), headroomFor(cfg.stack.Backend))
		setGCPercent(log, gcPercentFor(cfg.stack.Backend, cfg.GCPercent))
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

// watchSignals stops the service (stop: drain, then exit) on the first
// signal from sig and closes it without draining on a second one.
func watchSignals(ctx context.Context, stop func(), sig <-chan os.Signal, srv *server.Server, log *slog.Logger) {
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
}

// built is the result of loadAndAttach.
type built struct {
	st  *stack
	err error
}

// loadAndAttach builds the stack, attaches it to srv and warms it up (at
// most 5 minutes). On an error after the build, the stack is returned too
// so the caller can close it.
func loadAndAttach(ctx context.Context, srv *server.Server, cfg stackConfig, log *slog.Logger) (*stack, error) {
	t0 := time.Now()
	st, err := buildStack(cfg)
	if err != nil {
		return nil, err
	}
	name := st.Model.Name
	if name == "" {
		name = "chunlian"
	}
	srv.Attach(server.Backend{Generator: st.Gen, Stats: st.Engine.Stats, ModelName: name, EngineName: cfg.Engine,
		MaxModelLen: st.Model.Config.MaxPositions,
		GPU:         gpuHook(st)}) // gpuHook: stack_cuda.go
	spring := "off"
	if st.Spring != nil {
		spring = st.Spring.Name
	}
	log.Info("model loaded", "model", name, "spring_model", spring, "engine", cfg.Engine, "backend", cfg.Backend,
		"engines", len(st.Backends), "kv_blocks", st.kvBlocks(), "block_size", st.Backend.BlockSize(), "s", time.Since(t0).Seconds())
	if cb, ok := st.Backend.(*forward.CPU); ok {
		log.Info("cpu kernels", "kernels", cb.Kernels()) // why a machine is slow, in one line
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	return st, srv.Warmup(wctx)
}

// cudaDefaultGCPercent is GOGC on the CUDA backend: off, so that only the
// memory limit (live heap + cudaMemLimitHeadroom) starts a collection. Its
// Go heap holds little but the requests, so at GOGC=100 the GC ran
// several times a second under load and scanning the waiting requests'
// stacks took a fifth of the server's CPU (docs/DECISIONS.md, "The GC
// target on the GPU").
const cudaDefaultGCPercent = -1

// gcPercentFor resolves --gc-percent for backend: the flag when set,
// else off on CUDA and the runtime's on the CPU.
func gcPercentFor(backend string, flag int) int {
	if flag == 0 && backend == "cuda" {
		return cudaDefaultGCPercent
	}
	return flag
}

// setGCPercent sets GOGC when asked (p ≠ 0) and the GOGC variable does
// not; like the memory limit it is process-wide, so it lives in cmd.
func setGCPercent(log *slog.Logger, p int) {
	if p == 0 || os.Getenv("GOGC") != "" {
		return
	}
	debug.SetGCPercent(p)
	log.Info("gc percent", "gogc", p)
}

// memLimitHeadroom is the floor of the heap growth allowed above the live
// heap of a loaded, warmed-up server on the CPU (the figures behind it are
// in docs/DECISIONS.md: requests allocate little; the live heap is the
// weights and the KV cache). cudaMemLimitHeadroom is CUDA's: there the GC
// is off and this headroom is all that starts a collection.
const (
	memLimitHeadroom     = 256 << 20
	cudaMemLimitHeadroom = 2 << 30
)

// headroomFor is the memory limit's headroom floor on backend.
func headroomFor(backend string) int64 {
	if backend == "cuda" {
		return cudaMemLimitHeadroom
	}
	return memLimitHeadroom
}

// setMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) once
// the model is loaded and warmed up: live heap (weights + KV cache, which
// sit on the Go heap with the CPU backend) plus max(headroom, half of it).
// Without it the GC lets the heap grow to twice the live heap (GOGC=100),
// so the weights alone doubled RSS. explicit > 0 sets that limit instead;
// a GOMEMLIMIT in the environment (the runtime's own setting) wins over
// both. It is process-wide state, so it lives in cmd, not in a library.
func setMemoryLimit(log *slog.Logger, explicit, headroom int64) {
	if os.Getenv("GOMEMLIMIT") != "" {
		log.Info("memory limit from GOMEMLIMIT", "bytes", debug.SetMemoryLimit(-1))
		return
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	live := int64(ms.HeapAlloc)
	limit := explicit
	if limit <= 0 {
		limit = live + max(headroom, live/2)
	}
	debug.SetMemoryLimit(limit)
	log.Info("memory limit", "limit_mib", limit>>20, "live_heap_mib", live>>20)
}
