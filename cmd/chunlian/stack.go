package main

// stack.go builds the inference stack shared by `serve`, `generate` and
// `bench --spawn`: model → forward backend → engine → couplet generator, from
// one typed config that comes from flags with CHUNLIAN_* environment
// fallbacks (precedence: flag > env > built-in default).

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"chunlian/couplet"
	"chunlian/engine"
	"chunlian/forward"
	"chunlian/model"
)

// stackConfig is the whole inference stack's configuration. The zero value
// is not valid; use defaultStackConfig (or register, which starts from it).
type stackConfig struct {
	ModelDir            string                            // "" = the embedded default model
	Engine              string                            // paged | naive
	Backend             string                            // auto | cpu | cuda
	KVCacheBytes        byteSize                          // 0 = the backend's default
	BlockSize           int                               // tokens per KV block; 0 = the backend's (blockSizeFor)
	MaxNumSeqs          int                               // sequences per engine step
	MaxNumBatchedTokens int                               // tokens per engine step
	MaxQueue            int                               // waiting requests before ErrQueueFull
	Threads             int                               // CPU backend threads; 0 = GOMAXPROCS
	CPUInt8             bool                              // CPU backend: small-batch GEMMs on int8 weight copies
	PrefixCaching       bool                              // automatic prefix caching (paged engine)
	DeviceSampling      bool                              // draw tokens where the logits are (cuda backend)
	OverlapSteps        bool                              // two steps in flight (cuda backend with device sampling)
	SamplesPerCouplet   int                               // constrained samples drawn and ranked per returned couplet
	BannerCandidates    int                               // retrieved 横批 candidates scored by the model per couplet
	CUDA                cudaConfig                        // CUDA-only flags (stack_cuda.go)
	envErrs             []error                           // malformed CHUNLIAN_* values, reported by Validate
	wrapEngine          func(engine.Engine) engine.Engine // optional decorator (metrics); not a flag
	logger              *slog.Logger                      // serve's logger for start-up notes; nil = plain stderr lines; not a flag
}

// defaultStackConfig holds the built-in defaults (they match engine's and
// forward's own defaults so that "unset" and "default" mean the same,
// except BlockSize: 0 is resolved per backend by blockSizeFor, where
// forward.NewCPU alone would take 16).
func defaultStackConfig() stackConfig {
	return stackConfig{
		Engine:              "paged",
		Backend:             "auto",
		BlockSize:           0, // per backend: blockSizeFor
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 2048,
		MaxQueue:            1024,
		PrefixCaching:       true,
		DeviceSampling:      true,
		OverlapSteps:        true,
		// One sample per couplet: the rules already guarantee the form, and a
		// second ranked sample costs ~2× the decode work for a small gain in
		// quality (docs/BENCHMARKS.md); raise it for quality over throughput.
		SamplesPerCouplet: 1,
		// 横批: the model's own plus the 4 retrieved candidates (of a
		// lexical pool of 32) whose first character the model finds
		// likeliest; ranks better than 8 lexical ones at half the rows
		// (couplet.BenchmarkBannerQuality).
		BannerCandidates: couplet.DefaultBannerTopK,
	}
}

// register resets c to the defaults overlaid with CHUNLIAN_* env values and
// registers the stack flags on fs, so a parsed flag wins over env, env over
// default. Env parse errors are kept and reported by Validate.
func (c *stackConfig) register(fs *flag.FlagSet) {
	*c = defaultStackConfig()
	c.envString("CHUNLIAN_MODEL", &c.ModelDir)
	c.envString("CHUNLIAN_ENGINE", &c.Engine)
	c.envString("CHUNLIAN_BACKEND", &c.Backend)
	if v, ok := os.LookupEnv("CHUNLIAN_KV_CACHE_MEMORY"); ok {
		if err := c.KVCacheBytes.Set(v); err != nil {
			c.envErrs = append(c.envErrs, fmt.Errorf("CHUNLIAN_KV_CACHE_MEMORY=%q: %v", v, err))
		}
	}
	c.envInt("CHUNLIAN_BLOCK_SIZE", &c.BlockSize)
	c.envInt("CHUNLIAN_MAX_NUM_SEQS", &c.MaxNumSeqs)
	c.envInt("CHUNLIAN_MAX_NUM_BATCHED_TOKENS", &c.MaxNumBatchedTokens)
	c.envInt("CHUNLIAN_MAX_QUEUE", &c.MaxQueue)
	c.envInt("CHUNLIAN_THREADS", &c.Threads)
	c.envBool("CHUNLIAN_PREFIX_CACHING", &c.PrefixCaching)
	c.envBool("CHUNLIAN_INT8", &c.CPUInt8)
	c.envBool("CHUNLIAN_DEVICE_SAMPLING", &c.DeviceSampling)
	c.envBool("CHUNLIAN_OVERLAP_STEPS", &c.OverlapSteps)
	c.envInt("CHUNLIAN_SAMPLES_PER_COUPLET", &c.SamplesPerCouplet)
	c.envInt("CHUNLIAN_BANNER_CANDIDATES", &c.BannerCandidates)

	fs.StringVar(&c.ModelDir, "model", c.ModelDir, "model directory (Hugging Face layout + chunlian.json); empty = embedded default model [CHUNLIAN_MODEL]")
	fs.StringVar(&c.Engine, "engine", c.Engine, "engine: paged (continuous batching, paged KV cache) or naive (one request at a time, no cache reuse) [CHUNLIAN_ENGINE]")
	fs.StringVar(&c.Backend, "backend", c.Backend, "forward backend: auto, cpu or cuda [CHUNLIAN_BACKEND]")
	fs.Var(&c.KVCacheBytes, "kv-cache-memory", "KV cache size in bytes, suffixes KiB MiB GiB (or K M G) accepted, e.g. 64MiB; 0 = backend default [CHUNLIAN_KV_CACHE_MEMORY]")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "tokens per KV cache block; 0 = the backend's default: 1 on the CPU (no slot of the cache left empty), 16 with CUDA [CHUNLIAN_BLOCK_SIZE]")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "max sequences per engine step [CHUNLIAN_MAX_NUM_SEQS]")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "max tokens per engine step [CHUNLIAN_MAX_NUM_BATCHED_TOKENS]")
	fs.IntVar(&c.MaxQueue, "max-queue", c.MaxQueue, "max waiting requests; beyond it requests are rejected (HTTP 503) [CHUNLIAN_MAX_QUEUE]")
	fs.IntVar(&c.Threads, "threads", c.Threads, "CPU backend threads; 0 = all cores [CHUNLIAN_THREADS]")
	fs.BoolVar(&c.CPUInt8, "cpu-int8", c.CPUInt8, "CPU backend: run GEMMs of 1..256 rows on int8 copies of the weights (per-row scales; ~1.3x faster decode here, logits differ from bf16 by up to ~0.4, see docs/BENCHMARKS.md) [CHUNLIAN_INT8]")
	fs.BoolVar(&c.PrefixCaching, "prefix-caching", c.PrefixCaching, "automatic prefix caching (paged engine) [CHUNLIAN_PREFIX_CACHING]")
	fs.BoolVar(&c.DeviceSampling, "device-sampling", c.DeviceSampling, "cuda backend: draw tokens on the GPU (masks, top-k/top-p/min-p) so that only 8 bytes per row reach the host; false = copy every logits row and sample on the host [CHUNLIAN_DEVICE_SAMPLING]")
	fs.BoolVar(&c.OverlapSteps, "overlap-steps", c.OverlapSteps, "cuda backend with --device-sampling: from 128 sequences on, keep two engine steps in flight, so that the host consumes one while the GPU computes the other; false = one step at a time [CHUNLIAN_OVERLAP_STEPS]")
	fs.IntVar(&c.SamplesPerCouplet, "samples-per-couplet", c.SamplesPerCouplet, "constrained samples drawn and ranked for each returned couplet (quality vs throughput) [CHUNLIAN_SAMPLES_PER_COUPLET]")
	fs.IntVar(&c.BannerCandidates, "banner-candidates", c.BannerCandidates, "retrieved 横批 candidates scored by the model per couplet (the likeliest of a lexical pool of 32); 0 = the model's own 横批 only [CHUNLIAN_BANNER_CANDIDATES]")
	c.CUDA.register(fs)
}

// generatorOptions are the couplet generator's options from this config.
func (c *stackConfig) generatorOptions() []couplet.Option {
	return []couplet.Option{
		couplet.WithBannerSources(bannerSources(c.ModelDir)...), // generate.go
		couplet.WithOversample(c.SamplesPerCouplet),
		couplet.WithBannerTopK(c.BannerCandidates),
	}
}

func (c *stackConfig) envString(name string, dst *string) {
	if v, ok := os.LookupEnv(name); ok {
		*dst = v
	}
}

func (c *stackConfig) envInt(name string, dst *int) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		c.envErrs = append(c.envErrs, fmt.Errorf("%s=%q: not an integer", name, v))
		return
	}
	*dst = n
}

func (c *stackConfig) envBool(name string, dst *bool) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		c.envErrs = append(c.envErrs, fmt.Errorf("%s=%q: not a boolean (true/false/1/0)", name, v))
		return
	}
	*dst = b
}

// Validate reports every problem at once, each naming the flag to fix.
func (c *stackConfig) Validate() error {
	errs := append([]error(nil), c.envErrs...)
	switch c.Engine {
	case "paged", "naive":
	default:
		errs = append(errs, fmt.Errorf("--engine %q: want paged or naive", c.Engine))
	}
	switch c.Backend {
	case "auto", "cpu", "cuda":
	default:
		errs = append(errs, fmt.Errorf("--backend %q: want auto, cpu or cuda", c.Backend))
	}
	if c.KVCacheBytes < 0 {
		errs = append(errs, fmt.Errorf("--kv-cache-memory %d: must be ≥ 0", c.KVCacheBytes))
	}
	if c.BlockSize < 0 || c.BlockSize > 1024 {
		errs = append(errs, fmt.Errorf("--block-size %d: want 1..1024, or 0 for the backend's default", c.BlockSize))
	}
	if c.MaxNumSeqs < 1 {
		errs = append(errs, fmt.Errorf("--max-num-seqs %d: must be ≥ 1", c.MaxNumSeqs))
	}
	if c.MaxNumBatchedTokens < 1 {
		errs = append(errs, fmt.Errorf("--max-num-batched-tokens %d: must be ≥ 1", c.MaxNumBatchedTokens))
	}
	if c.MaxQueue < 0 {
		errs = append(errs, fmt.Errorf("--max-queue %d: must be ≥ 0", c.MaxQueue))
	}
	if c.SamplesPerCouplet < 1 || c.SamplesPerCouplet > 8 {
		errs = append(errs, fmt.Errorf("--samples-per-couplet %d: want 1..8", c.SamplesPerCouplet))
	}
	if c.BannerCandidates < 0 || c.BannerCandidates > 64 {
		errs = append(errs, fmt.Errorf("--banner-candidates %d: want 0..64", c.BannerCandidates))
	}
	if c.CUDA.Device < 0 {
		errs = append(errs, fmt.Errorf("--device %d: want a CUDA device ordinal ≥ 0 (CHUNLIAN_DEVICE must be an integer)", c.CUDA.Device))
	}
	if c.Threads < 0 {
		errs = append(errs, fmt.Errorf("--threads %d: must be ≥ 0 (0 = all cores)", c.Threads))
	}
	if c.ModelDir != "" {
		if st, err := os.Stat(c.ModelDir); err != nil {
			errs = append(errs, fmt.Errorf("--model %q: %v", c.ModelDir, err))
		} else if !st.IsDir() {
			errs = append(errs, fmt.Errorf("--model %q: not a directory", c.ModelDir))
		}
	}
	return errors.Join(errs...)
}

// stack is a built inference stack. Close releases it in reverse order.
type stack struct {
	Config  stackConfig
	Model   *model.Model
	Backend forward.Backend
	Engine  engine.Engine // possibly wrapped by Config.wrapEngine
	Gen     *couplet.Generator
}

// buildStack validates cfg and builds model, backend, engine and generator.
// On error everything built so far is released.
func buildStack(cfg stackConfig) (*stack, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var (
		m   *model.Model
		err error
	)
	if cfg.ModelDir == "" {
		m, err = model.Default()
	} else {
		m, err = model.Load(cfg.ModelDir)
	}
	if err != nil {
		return nil, fmt.Errorf("loading model: %w", err)
	}
	return buildStackFor(cfg, m)
}

// buildStackFor builds the stack on an already loaded model (tests use a
// random model).
func buildStackFor(cfg stackConfig, m *model.Model) (*stack, error) {
	s := &stack{Config: cfg, Model: m}
	var err error
	backend := cfg.Backend
	if backend == "auto" {
		backend = "cpu"
		if autoBackendIsCUDA(cfg) {
			backend = "cuda"
		}
	}
	cfg.BlockSize = blockSizeFor(backend, cfg.BlockSize)
	s.Config = cfg
	switch backend {
	case "cpu":
		s.Backend, err = forward.NewCPU(m, forward.CPUOptions{
			BlockSize:    cfg.BlockSize,
			KVCacheBytes: int64(cfg.KVCacheBytes),
			Threads:      cfg.Threads,
			Int8:         cfg.CPUInt8,
		})
	case "cuda":
		s.Backend, err = newCUDABackend(cfg, m) // stack_cuda.go
	}
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	var eng engine.Engine
	switch cfg.Engine {
	case "naive":
		eng = engine.NewNaive(s.Backend)
	default:
		eng, err = engine.New(s.Backend, engine.Config{
			BlockSize:           cfg.BlockSize,
			MaxNumSeqs:          cfg.MaxNumSeqs,
			MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
			MaxQueue:            cfg.MaxQueue,
			EnablePrefixCaching: cfg.PrefixCaching,
			HostSampling:        !cfg.DeviceSampling,
			NoOverlap:           !cfg.OverlapSteps,
		})
	}
	if err != nil {
		s.Backend.Close()
		return nil, fmt.Errorf("engine: %w", err)
	}
	if cfg.wrapEngine != nil {
		eng = cfg.wrapEngine(eng)
	}
	s.Engine = eng
	s.Gen, err = couplet.New(m, eng, cfg.generatorOptions()...)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("couplet generator: %w", err)
	}
	return s, nil
}

// The default KV block size of each backend (--block-size 0).
//
// The engine issue specifies 16 tokens, vLLM's default; the CUDA backend
// keeps it. On the CPU, 16-token blocks left ~40 % of the allocated slots
// empty under a couplet load (a couplet's sequences are 21–26 tokens, so
// each wastes most of a block), against the goal of ≥ 96 % live;
// 1-token blocks hold only live tokens (100 %) and were as fast or faster
// on the 2-core machine, since more of each prompt is found in cached
// full blocks. On the H200, block size 1 was 8 % faster at 10 users but
// 20 % slower at 1000, where the engine goroutine's per-block host work
// is the limit. Figures: docs/BENCHMARKS.md, session 7.
const (
	cpuDefaultBlockSize  = 1
	cudaDefaultBlockSize = 16
)

// blockSizeFor resolves --block-size for backend ("cpu" or "cuda").
func blockSizeFor(backend string, flag int) int {
	switch {
	case flag > 0:
		return flag
	case backend == "cuda":
		return cudaDefaultBlockSize
	}
	return cpuDefaultBlockSize
}

// Close stops the engine (requests still running get engine.ErrClosed) and
// frees the backend's cache.
func (s *stack) Close() error {
	var errs []error
	if s.Engine != nil {
		errs = append(errs, s.Engine.Close())
	}
	if s.Backend != nil {
		errs = append(errs, s.Backend.Close())
	}
	return errors.Join(errs...)
}

// byteSize is a flag.Value for byte counts with binary suffixes.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

// Set parses "123", "64MiB", "64M", "1.5GiB", "512k" (K/M/G and KiB/MiB/GiB
// are both powers of 1024; a trailing B is optional).
func (b *byteSize) Set(s string) error {
	t := strings.TrimSpace(s)
	u := strings.ToUpper(t)
	mult := int64(1)
	for _, sfx := range []struct {
		s string
		m int64
	}{{"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10},
		{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10},
		{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(u, sfx.s) {
			mult = sfx.m
			u = strings.TrimSpace(u[:len(u)-len(sfx.s)])
			break
		}
	}
	if u == "" {
		return fmt.Errorf("%q: not a byte size (e.g. 64MiB)", s)
	}
	f, err := strconv.ParseFloat(u, 64)
	if err != nil || f < 0 || f*float64(mult) > 1<<62 {
		return fmt.Errorf("%q: not a byte size (e.g. 64MiB)", s)
	}
	*b = byteSize(f * float64(mult))
	return nil
}
