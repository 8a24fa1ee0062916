// Package server is chunlian's HTTP service: the couplet API (POST
// /generate, compatible with the seed service), OpenAI-compatible completion
// endpoints, health/readiness, Prometheus metrics, a JSON stats feed for the
// dashboard, and the embedded web page and dashboard.
//
// Concurrency: every handler runs on its own net/http goroutine. The server's
// mutable state is either atomic (readiness, the attached backend) or owned by
// a mutex (rolling stats); the generator and engine are safe for concurrent
// use by contract. Generation work itself happens on the engine goroutine;
// handlers only wait for it under their request context, so a client that
// disconnects (or a --request-timeout) cancels the engine request, which then
// frees its KV blocks at the next engine step.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"chunlian/couplet"
	"chunlian/engine"
)

// Generator writes couplets; *couplet.Generator implements it.
type Generator interface {
	Generate(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error)
}

// GPUStats is one reading of the accelerator, for metrics and the dashboard.
type GPUStats struct {
	UtilizationPerc  float64 `json:"utilization_perc"` // 0..100
	MemoryUsedBytes  int64   `json:"memory_used_bytes"`
	MemoryTotalBytes int64   `json:"memory_total_bytes"`
}

// Backend is what the server serves once the model is loaded: the generator
// plus read-only views of the engine for metrics. It is attached after the
// server already listens (so /health answers and /ready says 503 while the
// model loads).
type Backend struct {
	Generator Generator
	// Stats returns an engine snapshot; nil means zeros.
	Stats func() engine.Stats
	// GPU, when set, reports accelerator use (hook for the CUDA backend);
	// ok=false means no reading now.
	GPU func() (s GPUStats, ok bool)
	// ModelName is shown by /v1/models and echoed in OpenAI responses.
	ModelName string
	// EngineName is informational (paged|naive), shown on the dashboard.
	EngineName string
	// MaxModelLen is the model's context length in tokens
	// (max_position_embeddings), reported by /v1/models; 0 = not reported.
	MaxModelLen int
}

// Config configures the HTTP layer. Zero values mean the documented default.
type Config struct {
	// APIKey, when set, is required as "Authorization: Bearer KEY" on the API
	// (/generate, /v1/*) and on /metrics and /api/stats (the dashboard's
	// data; see PublicMetrics). The web pages, static files, /health and
	// /ready stay open.
	APIKey string
	// PublicMetrics leaves /metrics and /api/stats open even with APIKey set
	// (for a scraper on a trusted network).
	PublicMetrics bool
	// CORSOrigins lists allowed browser origins ("*" = any). Empty = CORS off:
	// no Access-Control-* headers are ever sent.
	CORSOrigins []string
	// RequestTimeout bounds one generation (0 = no limit); past it the client
	// gets 504 and the engine request is cancelled.
	RequestTimeout time.Duration
	// DrainTimeout bounds graceful shutdown (default 30s).
	DrainTimeout time.Duration
	// DrainDelay is how long, once shutdown begins, /ready says 503 while
	// requests are still served, before the listener closes (0 = close at
	// once): long enough for the balancer's readiness checks to notice.
	DrainDelay time.Duration
	// MaxBodyBytes bounds request bodies (default 64 KiB); larger → 413.
	MaxBodyBytes int64
	// MaxInFlight is a hard bound on concurrent generation requests in the
	// HTTP layer (default 256); beyond it → 503 + Retry-After without
	// queueing. Admission (adaptive, cost-aware) usually refuses well before.
	MaxInFlight int
	// Admission tunes the adaptive, cost-aware admission (admission.go).
	Admission AdmissionConfig
	// MaxConns caps open client connections (default 2048); see
	// ProbeReserveConns. Past both, new connections wait in the kernel's
	// backlog.
	MaxConns int
	// ProbeReserveConns are extra connections beyond MaxConns that may only
	// ask /health and /ready (default 32), so probes get through a flood.
	ProbeReserveConns int
	// WriteTimeout bounds every single write of a response (default 30s;
	// renewed before each write, so streams and long generations are not
	// cut): a client that stops reading loses its request.
	WriteTimeout time.Duration
	// Logger for structured logs (default slog.Default()).
	Logger *slog.Logger
	// Pprof mounts Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/ for operators profiling a live server. Off by default: a
	// profile costs CPU and reveals internals. With APIKey set they need the
	// key like the API.
	Pprof bool
	// Registry receives the metrics (default: a fresh registry with process
	// and Go collectors). Tests use one server per registry.
	Registry *prometheus.Registry
}

// Validate checks the config; every message names the flag.
func (c *Config) Validate() error {
	var errs []error
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("--request-timeout %v: must be ≥ 0", c.RequestTimeout))
	}
	if c.DrainDelay < 0 {
		errs = append(errs, fmt.Errorf("--drain-delay %v: must be ≥ 0", c.DrainDelay))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("--drain-timeout %v: must be ≥ 0", c.DrainTimeout))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max body bytes %d: must be ≥ 0", c.MaxBodyBytes))
	}
	if c.MaxConns < 0 || c.ProbeReserveConns < 0 {
		errs = append(errs, fmt.Errorf("--max-conns %d / --probe-reserve-conns %d: must be ≥ 0", c.MaxConns, c.ProbeReserveConns))
	}
	if c.WriteTimeout < 0 {
		errs = append(errs, fmt.Errorf("--write-timeout %v: must be ≥ 0", c.WriteTimeout))
	}
	if c.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("--max-in-flight %d: must be ≥ 0", c.MaxInFlight))
	}
	if ad := c.Admission; ad.LatencyFactor < 0 || ad.OverloadFactor < 0 || ad.QueueTarget < 0 {
		errs = append(errs, fmt.Errorf("--admission-latency-factor %v / --admission-overload-factor %v / --admission-queue-target %v: must be ≥ 0", ad.LatencyFactor, ad.OverloadFactor, ad.QueueTarget))
	}
	for _, o := range c.CORSOrigins {
		if o != "*" && !(len(o) > 7 && (o[:7] == "http://" || (len(o) > 8 && o[:8] == "https://"))) {
			errs = append(errs, fmt.Errorf("--cors-origin %q: want * or an origin like https://example.com", o))
		}
	}
	return errors.Join(errs...)
}

// DefaultMaxConns is Config.MaxConns's default.
const DefaultMaxConns = 2048

// readiness states.
const (
	stateLoading int32 = iota
	stateReady
	stateLeaving  // shutdown begun: /ready 503, requests still admitted (DrainDelay)
	stateDraining // listener closed: new requests get 503 shutting_down
)

// Server is the HTTP service. Create with New, Attach a Backend, Warmup,
// then Serve (or mount Handler in a test server).
type Server struct {
	cfg      Config
	log      *slog.Logger
	metrics  *Metrics
	stats    *rollingStats
	backend  atomic.Pointer[Backend]
	state    atomic.Int32
	inflight chan struct{} // semaphore: one token per generation in progress; cap MaxInFlight
	adm      *admission
	handler  http.Handler
	started  time.Time

	force     chan struct{} // closed by Close: skip the rest of the drain
	forceOnce sync.Once
	after     func(time.Duration) <-chan time.Time // the drain delay's clock (time.After; tests replace it)
}

// New validates cfg and builds the server (not yet ready).
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 64 << 10
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 256
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.ProbeReserveConns == 0 {
		cfg.ProbeReserveConns = 32
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		stats:    newRollingStats(),
		inflight: make(chan struct{}, cfg.MaxInFlight),
		adm:      newAdmission(cfg.Admission, nil),
		started:  time.Now(),
		force:    make(chan struct{}),
		after:    time.After,
	}
	s.metrics = newMetrics(cfg.Registry, s)
	s.handler = s.routes()
	return s, nil
}

// Metrics returns the server's metrics (to instrument the engine).
func (s *Server) Metrics() *Metrics { return s.metrics }

// Handler is the whole HTTP handler (middleware included).
func (s *Server) Handler() http.Handler { return s.handler }

// Attach installs the loaded backend. Requests that need it get 503 until
// Attach; /ready stays 503 until Warmup succeeds.
func (s *Server) Attach(b Backend) {
	name := b.ModelName
	s.metrics.modelName.Store(&name)
	s.backend.Store(&b)
}

// Ready reports whether /ready says 200.
func (s *Server) Ready() bool { return s.state.Load() == stateReady }

// Warmup runs one generation in keyword mode (平安, fixed seed) and one in
// lower mode (its 上联), which may run on another model's engines, so that
// the first user of either does not pay for lazy initialisation, then
// marks the server ready. It fails if no backend is attached or a
// generation fails.
func (s *Server) Warmup(ctx context.Context) error {
	b := s.backend.Load()
	if b == nil || b.Generator == nil {
		return errors.New("server: warm-up before a backend is attached")
	}
	t0 := time.Now()
	cs, err := b.Generator.Generate(ctx, couplet.Request{Mode: couplet.ModeKeyword, Text: "平安", N: 1, Seed: 1})
	if err != nil {
		return fmt.Errorf("server: warm-up generation: %w", err)
	}
	if len(cs) == 0 {
		return errors.New("server: warm-up generation returned no couplet")
	}
	if _, err := b.Generator.Generate(ctx, couplet.Request{Mode: couplet.ModeLower, Text: cs[0].Upper, N: 1, Seed: 1}); err != nil {
		return fmt.Errorf("server: lower-mode warm-up generation: %w", err)
	}
	s.log.Info("warm-up done", "couplet", cs[0].Upper+" / "+cs[0].Lower+" / "+cs[0].Banner,
		"ms", float64(time.Since(t0).Microseconds())/1000)
	s.state.CompareAndSwap(stateLoading, stateReady)
	return nil
}

// Serve serves on ln until ctx ends (SIGTERM/SIGINT in `chunlian serve`),
// then drains (drain.go): /ready turns 503 while requests are still served
// for DrainDelay, then the listener closes (no new connections), in-flight
// requests finish for up to DrainTimeout, and Serve returns nil. Requests
// still running after the drain timeout are cut off (their contexts are
// cancelled, so the engine frees their blocks) and Serve returns nil too,
// after logging it; Close makes it return ErrForced at once; a listener
// failure is returned as an error.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler: s.handler,
		// No ReadTimeout: net/http keeps that deadline on the connection while
		// the handler runs and cancels the request context when it passes,
		// which would cut long generations; readJSON bounds the body read
		// itself. No WriteTimeout either: streams legitimately last long
		// (generation time is bounded by --request-timeout); instead every
		// write has WriteTimeout (statusWriter).
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext:       connContext,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	tickCtx, stopTick := context.WithCancel(context.Background())
	defer stopTick()
	go s.stats.run(tickCtx, s.sampleGauges)

	ln = newLimitListener(ln, s.cfg.MaxConns, s.cfg.ProbeReserveConns)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	s.log.Info("listening", "addr", ln.Addr().String())
	if exposedWithoutKey(ln.Addr(), s.cfg.APIKey) {
		s.log.Warn("listening on a non-loopback address without an API key: anyone who can reach it can generate and read the dashboard data; set --api-key", "addr", ln.Addr().String())
	}

	select {
	case err := <-errc:
		return fmt.Errorf("server: %w", err)
	case <-s.force:
		return s.forceClose(hs, errc)
	case <-ctx.Done():
	}
	return s.drain(hs, errc) // drain.go
}

// sampleGauges records the engine gauges into the rolling stats (called by
// the once-a-second ticker and by /api/stats).
func (s *Server) sampleGauges(now time.Time) {
	b := s.backend.Load()
	var g gaugeSample
	if b != nil && b.Stats != nil {
		st := b.Stats()
		g.running, g.waiting = st.Running, st.Waiting
		if st.KVBlocksTotal > 0 {
			g.kv = float64(st.KVBlocksUsed) / float64(st.KVBlocksTotal)
		}
		g.genTokens, g.promptTokens = st.GenTokens, st.PromptTokens
		g.prefixQ, g.prefixH = st.PrefixQueries, st.PrefixHits
		g.valid = true
	}
	if b != nil && b.GPU != nil {
		if gs, ok := b.GPU(); ok {
			g.gpu, g.gpuOK = gs, true
		}
	}
	s.stats.sample(now, g)
}

// exposedWithoutKey reports a TCP listener reachable from other hosts
// (not loopback: a specific outside address or the unspecified 0.0.0.0/::)
// with no API key set.
func exposedWithoutKey(a net.Addr, key string) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && key == "" && !ta.IP.IsLoopback()
}
