package main

// stack.go builds the inference stack shared by `serve`, `generate`, `eval`
// and `bench --spawn`: model → forward backend → engine → couplet
// generator, from one typed config filled by flags (and their CHUNLIAN_*
// variables, main.go's bindEnv), and the --experimental feature list.

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"chunlian/couplet"
	"chunlian/critic"
	"chunlian/engine"
	"chunlian/forward"
	"chunlian/kernels/cpu"
	"chunlian/model"
	"chunlian/quality"
)

// stackConfig is the whole inference stack's configuration. The zero value
// is not valid; use defaultStackConfig (the register methods start from it).
type stackConfig struct {
	ModelDir            string     // "" = the embedded default model
	SpringModel         string     // the blessing modes' model: "" = the embedded spring model when ModelDir is "" (else ModelDir's), "off" = ModelDir's, or a directory
	Engine              string     // paged | naive
	Backend             string     // auto | cpu | cuda
	KVCacheBytes        byteSize   // 0 = the backend's default
	BlockSize           int        // tokens per KV block; 0 = the backend's default
	MaxNumSeqs          int        // sequences per engine step
	MaxNumBatchedTokens int        // tokens per engine step
	MaxQueue            int        // waiting requests before ErrQueueFull (per engine)
	Engines             int        // engine loops per model sharing the device, each with its own backend and KV cache share; 0 = the backend's default
	Threads             int        // CPU kernel threads; 0 = GOMAXPROCS
	CPUGEMM             string     // auto | openblas | asm | go: the CPU kernel path (cpu.SetGEMMPath)
	CPUPrecision        string     // auto | bf16 | fp32: the CPU GEMMs' inputs (cpuBF16Dot)
	PrefixCaching       bool       // automatic prefix caching (paged engine)
	SamplesPerCouplet   int        // constrained samples drawn and ranked per returned couplet
	IdleSamples         int        // the same while the server is nearly idle (unseeded requests); 0 = the backend's default
	FinishSamples       int        // of those, how many write a 下联 after the 上联s are ranked; 0 = the backend's default
	RecentWindow        int        // a blessing word's last served couplets an unseeded request passes over; 0 = off
	DefaultTemperature  float64    // sampling temperature of requests that set none
	BannerCandidates    int        // retrieved 横批 candidates scored by the model per couplet
	BannersFile         string     // an operator's 横批 list instead of the embedded one
	FestivalYear        int        // the Spring Festival's Gregorian year for the year-animal check; 0 = from the clock
	Experimental        features   // --experimental
	CUDA                cudaConfig // CUDA-only flags (stack_cuda.go)
	// noKeep: the generator continues its requests through the prefix
	// cache, not kept samples; resolved by buildStackFor (CUDA without
	// featCUDAKeep). Not a flag.
	noKeep bool
	// wrapEngine is an optional engine decorator (metrics); not a flag.
	wrapEngine func(engine.Engine) engine.Engine
	// logger takes serve's start-up notes (nil = plain stderr lines), so
	// --log-format json stays JSON-only; not a flag.
	logger *slog.Logger
}

// Ranked samples per couplet when --samples-per-couplet is 0, by backend:
// 5 on both. Blind readers found 5 less odd than 3 with the spring model;
// with the best 上联s finished, 5 read as well as the GPU's earlier 8, for
// fewer model rows (docs/DECISIONS.md, "Samples per couplet" and
// "Finishing the best 上联s").
const (
	cpuDefaultSamples  = 5
	cudaDefaultSamples = 5
)

// Ranked samples per couplet while at most couplet.DefaultIdleBelow
// couplets are in flight, when --idle-samples is 0: with CUDA 16, written
// whole, which costs an idle GPU no latency; on the CPU the
// same as --samples-per-couplet (off), since there every sample costs its
// rows (docs/DECISIONS.md, "Samples per couplet").
const (
	cpuDefaultIdleSamples  = 0
	cudaDefaultIdleSamples = 16
)

// Samples per couplet that go on to write a 下联 when --finish-samples is
// 0, by backend, of the 5 上联s: the best 3 on the CPU, which read no
// worse than every sample finished, for about a fifth fewer model rows,
// and better than the best 2; the best 4 with CUDA, which read a little
// better than 3 for rows the GPU can spare (docs/DECISIONS.md,
// "Finishing the best 上联s").
const (
	cpuDefaultFinishSamples  = 3
	cudaDefaultFinishSamples = 4
)

// Engine loops per device when --engines is 0, by backend: one on the
// 2-core CPU (its kernels already use every core); on the GPU one loop's
// host work per row bounds throughput while the device idles, so several
// loops share it (docs/DECISIONS.md, "Engines per GPU").
const (
	cpuDefaultEngines  = 1
	cudaDefaultEngines = 2
)

// Engine step limits when --max-num-seqs / --max-num-batched-tokens are 0,
// by backend: the CPU takes engine.DefaultConfig's; the GPU batches
// thousands of sequences per step, and the CPU-sized limits left it a
// fraction of its throughput (docs/DECISIONS.md, "Step limits on the GPU").
const (
	cudaDefaultMaxNumSeqs          = 4096
	cudaDefaultMaxNumBatchedTokens = 16384
)

// resolveLimits sets the step limits left at 0 to backend's defaults.
func (c *stackConfig) resolveLimits(backend string) {
	e := engine.DefaultConfig()
	c.MaxNumSeqs = byBackend(backend, c.MaxNumSeqs, e.MaxNumSeqs, cudaDefaultMaxNumSeqs)
	c.MaxNumBatchedTokens = byBackend(backend, c.MaxNumBatchedTokens, e.MaxNumBatchedTokens, cudaDefaultMaxNumBatchedTokens)
}

// enginesFor resolves --engines for backend ("cpu" or "cuda").
func enginesFor(backend string, flag int) int {
	return byBackend(backend, flag, cpuDefaultEngines, cudaDefaultEngines)
}

// samplesFor resolves --samples-per-couplet for backend ("cpu" or "cuda").
func samplesFor(backend string, flag int) int {
	return byBackend(backend, flag, cpuDefaultSamples, cudaDefaultSamples)
}

// noKeepFor reports whether the generator on backend continues its
// requests through the prefix cache instead of kept samples: on CUDA
// unless featCUDAKeep, since kept samples lose when served on the GPU
// (docs/DECISIONS.md, "Kept samples continued by handle").
func noKeepFor(backend string, exp features) bool {
	return backend == "cuda" && !exp.Has(featCUDAKeep)
}

// byBackend is flag when it is set (> 0), else backend's default.
func byBackend(backend string, flag, cpu, cuda int) int {
	switch {
	case flag > 0:
		return flag
	case backend == "cuda":
		return cuda
	}
	return cpu
}

// defaultStackConfig holds the built-in defaults. Each is owned by the
// package that implements the setting (engine.DefaultConfig,
// couplet.Default*); block size, KV cache size and the step limits are
// the backend's own (0 here; resolveLimits).
func defaultStackConfig() stackConfig {
	e := engine.DefaultConfig()
	return stackConfig{
		Engine:             "paged",
		Backend:            "auto",
		MaxQueue:           e.MaxQueue,
		PrefixCaching:      e.EnablePrefixCaching,
		CPUGEMM:            "auto",
		CPUPrecision:       "auto",
		DefaultTemperature: couplet.DefaultTemperature,
		BannerCandidates:   couplet.DefaultBannerTopK,
		RecentWindow:       couplet.DefaultRecentWindow,
		CUDA:               defaultCUDAConfig(),
	}
}

// registerModel registers the flags every command that generates needs:
// which model, which backend, and how couplets are drawn. It resets c to
// the defaults first.
func (c *stackConfig) registerModel(fs *pflag.FlagSet) {
	*c = defaultStackConfig()
	fs.StringVar(&c.ModelDir, "model", c.ModelDir, "model directory (Hugging Face layout + chunlian.json); empty = embedded default model")
	fs.StringVar(&c.SpringModel, "spring-model", c.SpringModel, "model directory for the blessing-word modes (keyword, acrostic), sharing --model's tokenizer; lower mode always runs on --model; empty = the embedded spring model when --model is empty, else --model's; off = --model's for every mode")
	fs.StringVar(&c.Backend, "backend", c.Backend, "forward backend: auto, cpu or cuda")
	fs.IntVar(&c.Threads, "threads", c.Threads, "CPU kernel threads; 0 = all cores")
	fs.StringVar(&c.CPUGEMM, "cpu-gemm", c.CPUGEMM, "CPU kernel path: auto (fastest available), openblas (float32 GEMMs on OpenBLAS), asm (float32 GEMMs in plain Go; the default without OpenBLAS) or go (plain Go everywhere); the first two run the assembly kernels where the CPU has AVX2+FMA, and an unavailable one falls back to the next")
	fs.StringVar(&c.CPUPrecision, "cpu-precision", c.CPUPrecision, "CPU backend: inputs of the GEMMs on the bf16 weights: auto (bf16 where the CPU has AVX512_BF16, float32 elsewhere), bf16 (rounded everywhere; faster only with AVX512_BF16) or fp32; float32 accumulation in each, and the LM head's leading logits from float32 inputs")
	fs.IntVar(&c.RecentWindow, "recent-window", c.RecentWindow, "couplets served for a blessing word that a request without a seed passes over when another candidate ranks close (so that visitors typing the same word see different couplets); 0 = off")
	fs.IntVar(&c.IdleSamples, "idle-samples", c.IdleSamples, fmt.Sprintf("ranked samples per couplet for requests without a seed while at most %d couplets are in flight; 0 = the backend's default: off on the CPU, %d with CUDA; a value not above --samples-per-couplet turns it off", couplet.DefaultIdleBelow, cudaDefaultIdleSamples))
	fs.IntVar(&c.FinishSamples, "finish-samples", c.FinishSamples, fmt.Sprintf("of the samples per couplet, how many go on to write a 下联 after their 上联s are drawn and ranked (fewer model rows per couplet); a value not below --samples-per-couplet: all; 0 = the backend's default: %d on the CPU, %d with CUDA", cpuDefaultFinishSamples, cudaDefaultFinishSamples))
	fs.IntVar(&c.SamplesPerCouplet, "samples-per-couplet", c.SamplesPerCouplet, fmt.Sprintf("constrained samples drawn and ranked for each returned couplet (quality vs throughput); 0 = the backend's default: %d on the CPU, %d with CUDA", cpuDefaultSamples, cudaDefaultSamples))
	fs.IntVar(&c.BannerCandidates, "banner-candidates", c.BannerCandidates, "retrieved 横批 candidates scored by the model per couplet (the likeliest of a lexical pool of 32); 0 = the model's own 横批 only")
	fs.StringVar(&c.BannersFile, "banners-file", c.BannersFile, "a 横批 list of your own (one four-character phrase per line, # comments) used instead of the embedded curated list; empty = the embedded list")
	fs.IntVar(&c.FestivalYear, "festival-year", c.FestivalYear, "Gregorian year of the Spring Festival the couplets are for: candidates that welcome or bid farewell to another year's animal (玉兔迎春 for 2027, the year of the goat) rank last; 0 = the coming festival by the clock (from March on, next year's)")
	fs.Var(&c.Experimental, "experimental", "comma-separated experimental features: "+knownFeatures())
	fs.IntVar(&c.CUDA.Device, "device", c.CUDA.Device, "CUDA device ordinal to run on, counted among the GPUs CUDA_VISIBLE_DEVICES leaves visible (one replica per GPU: --device N, or CUDA_VISIBLE_DEVICES=N with --device 0)")
	fs.StringVar(&c.CUDA.LibDir, "cuda-lib-dir", c.CUDA.LibDir, "directory holding libcuda/libnvrtc/libcublas, searched first")
	fs.StringVar(&c.CUDA.Precision, "gpu-precision", c.CUDA.Precision, "CUDA GEMM precision of steps of more than one token: bf16 (bf16 weights and inputs), tf32 (float32 inputs on TF32 tensor cores) or fp32 (exact); float32 accumulation in each")
	fs.StringVar(&c.CUDA.NVRTCTarget, "cuda-nvrtc-target", c.CUDA.NVRTCTarget, "what NVRTC compiles the kernels to: cubin (default) or ptx (the driver compiles it; for an NVRTC that fails on a new GPU)")
}

// registerEngine registers the engine and KV cache flags (serve only;
// generate and eval run on the defaults).
func (c *stackConfig) registerEngine(fs *pflag.FlagSet) {
	fs.StringVar(&c.Engine, "engine", c.Engine, "engine: paged (continuous batching, paged KV cache) or naive (one request at a time, no cache reuse)")
	fs.Var(&c.KVCacheBytes, "kv-cache-memory", "KV cache size in bytes, suffixes KiB MiB GiB (or K M G) accepted, e.g. 64MiB; 0 = backend default")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, fmt.Sprintf("tokens per KV cache block; 0 = the backend's default: %d on the CPU, %d with CUDA", forward.DefaultCPUBlockSize, cudaDefaultBlockSize))
	e := engine.DefaultConfig()
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, fmt.Sprintf("max sequences per engine step; 0 = the backend's default: %d on the CPU, %d with CUDA", e.MaxNumSeqs, cudaDefaultMaxNumSeqs))
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, fmt.Sprintf("max tokens per engine step; 0 = the backend's default: %d on the CPU, %d with CUDA", e.MaxNumBatchedTokens, cudaDefaultMaxNumBatchedTokens))
	fs.IntVar(&c.MaxQueue, "max-queue", c.MaxQueue, "max waiting requests per engine; beyond it requests are rejected (HTTP 503)")
	fs.Float64Var(&c.DefaultTemperature, "default-temperature", c.DefaultTemperature, fmt.Sprintf("sampling temperature of requests that set none (0 < t ≤ %g)", couplet.Limits.MaxTemperature))
	fs.IntVar(&c.Engines, "engines", c.Engines, fmt.Sprintf("engine loops per model sharing the device, each with its own backend (a GPU stream) and an equal share of the KV cache; a request goes to the least busy loop of its mode's model; 0 = the backend's default: %d on the CPU, %d with CUDA", cpuDefaultEngines, cudaDefaultEngines))
	fs.BoolVar(&c.PrefixCaching, "prefix-caching", c.PrefixCaching, "automatic prefix caching (paged engine)")
	c.CUDA.register(fs)
}

// generatorOptions are the couplet generator's options from this config.
func (c *stackConfig) generatorOptions() []couplet.Option {
	return []couplet.Option{
		couplet.WithBannerSources(bannerSources(c.BannersFile)...), // generate.go
		couplet.WithOversample(c.SamplesPerCouplet),
		couplet.WithIdleSamples(c.IdleSamples, couplet.DefaultIdleBelow),
		couplet.WithFinishers(c.FinishSamples),
		couplet.WithKeptSamples(!c.noKeep),
		couplet.WithRecentWindow(c.RecentWindow),
		couplet.WithTemperature(float32(c.DefaultTemperature)),
		couplet.WithBannerTopK(c.BannerCandidates),
		couplet.WithJudge(critic.Judge{Year: c.festivalYear()}),
	}
}

// festivalYear is --festival-year, or the coming festival's year by the clock.
func (c *stackConfig) festivalYear() int {
	if c.FestivalYear != 0 {
		return c.FestivalYear
	}
	return critic.FestivalYear(time.Now())
}

// Validate reports every problem at once, each naming the flag to fix.
func (c *stackConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Engine != "paged" && c.Engine != "naive" {
		bad("--engine %q: want paged or naive", c.Engine)
	}
	switch c.Backend {
	case "auto", "cpu", "cuda":
	default:
		bad("--backend %q: want auto, cpu or cuda", c.Backend)
	}
	switch c.CPUGEMM {
	case "auto", "openblas", "asm", "go":
	default:
		bad("--cpu-gemm %q: want auto, openblas, asm or go", c.CPUGEMM)
	}
	switch c.CPUPrecision {
	case "auto", "bf16", "fp32":
	default:
		bad("--cpu-precision %q: want auto, bf16 or fp32", c.CPUPrecision)
	}
	if c.KVCacheBytes < 0 {
		bad("--kv-cache-memory %d: must be ≥ 0", c.KVCacheBytes)
	}
	if c.BlockSize < 0 || c.BlockSize > 1024 {
		bad("--block-size %d: want 1..1024, or 0 for the backend's default", c.BlockSize)
	}
	if c.MaxNumSeqs < 0 {
		bad("--max-num-seqs %d: must be ≥ 1, or 0 for the backend's default", c.MaxNumSeqs)
	}
	if c.MaxNumBatchedTokens < 0 {
		bad("--max-num-batched-tokens %d: must be ≥ 1, or 0 for the backend's default", c.MaxNumBatchedTokens)
	}
	if c.MaxQueue < 0 {
		bad("--max-queue %d: must be ≥ 0", c.MaxQueue)
	}
	if !(c.DefaultTemperature > 0 && c.DefaultTemperature <= couplet.Limits.MaxTemperature) {
		bad("--default-temperature %g: want 0 < t ≤ %g (a request asks for greedy with temperature 0)", c.DefaultTemperature, couplet.Limits.MaxTemperature)
	}
	if c.Engines < 0 || c.Engines > 16 {
		bad("--engines %d: want 1..16, or 0 for the backend's default", c.Engines)
	}
	if c.FestivalYear != 0 && (c.FestivalYear < 1900 || c.FestivalYear > 2200) {
		bad("--festival-year %d: want 1900..2200, or 0 for the coming festival", c.FestivalYear)
	}
	if c.RecentWindow < 0 || c.RecentWindow > 64 {
		bad("--recent-window %d: want 0..64", c.RecentWindow)
	}
	if c.IdleSamples < 0 || c.IdleSamples > 32 {
		bad("--idle-samples %d: want 1..32, or 0 for the backend's default", c.IdleSamples)
	}
	if c.FinishSamples < 0 || c.FinishSamples > 32 {
		bad("--finish-samples %d: want 1..32, or 0 for the backend's default", c.FinishSamples)
	}
	if c.SamplesPerCouplet < 0 || c.SamplesPerCouplet > 32 {
		bad("--samples-per-couplet %d: want 1..32, or 0 for the backend's default", c.SamplesPerCouplet)
	}
	if c.BannerCandidates < 0 || c.BannerCandidates > 64 {
		bad("--banner-candidates %d: want 0..64", c.BannerCandidates)
	}
	if c.CUDA.MaxBlocks < -1 {
		bad("--gpu-max-blocks %d: want ≥ 0, or -1 for %d tokens' worth", c.CUDA.MaxBlocks, cudaCacheTokens)
	}
	if c.CUDA.Device < 0 {
		errs = append(errs, fmt.Errorf("--device %d: want a CUDA device ordinal ≥ 0 (CHUNLIAN_DEVICE must be an integer)", c.CUDA.Device))
	}
	if c.Threads < 0 {
		bad("--threads %d: must be ≥ 0 (0 = all cores)", c.Threads)
	}
	for _, d := range []struct{ flag, dir string }{{"--model", c.ModelDir}, {"--spring-model", c.SpringModel}} {
		if d.dir == "" || (d.flag == "--spring-model" && d.dir == "off") {
			continue
		}
		if st, err := os.Stat(d.dir); err != nil {
			bad("%s %q: %v", d.flag, d.dir, err)
		} else if !st.IsDir() {
			bad("%s %q: not a directory", d.flag, d.dir)
		}
	}
	return errors.Join(errs...)
}

// stack is a built inference stack. Close releases it in reverse order.
type stack struct {
	Config   stackConfig
	Model    *model.Model      // lower mode's, and every mode's without Spring
	Spring   *model.Model      // the blessing modes' (--spring-model); nil = Model serves them
	Backend  forward.Backend   // Backends[0]
	Backends []forward.Backend // one per engine loop: --engines for Model, as many again for Spring
	Kind     string            // the resolved --backend: cpu or cuda
	// Engine is every engine loop, for Stats and Close. Generate only
	// through Gen: with Spring, a request must go to its mode's loops.
	Engine engine.Engine
	lower  engine.Engine // Model's loops, possibly wrapped by Config.wrapEngine
	style  engine.Engine // Spring's loops, likewise; nil without Spring
	Gen    *couplet.Generator
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
	var spring *model.Model
	switch {
	case cfg.SpringModel == "" && cfg.ModelDir == "":
		spring, err = model.DefaultSpring()
	case cfg.SpringModel != "" && cfg.SpringModel != "off":
		spring, err = model.Load(cfg.SpringModel)
	}
	if err != nil {
		return nil, fmt.Errorf("loading the spring model: %w", err)
	}
	if spring != nil {
		if err := m.Compatible(spring); err != nil {
			return nil, fmt.Errorf("--spring-model: %w", err)
		}
	}
	return buildStackFor(cfg, m, spring)
}

// configureKernels applies the process-wide CPU kernel settings (thread
// count, GEMM path): the one place that sets them.
func configureKernels(cfg stackConfig) {
	cpu.SetThreads(cfg.Threads)
	if cfg.CPUGEMM != "auto" {
		cpu.SetGEMMPath(cfg.CPUGEMM)
	}
}

// buildStackFor builds the stack on already loaded models (tests use
// random ones): m, and spring for the blessing modes unless it is nil
// (the caller checked m.Compatible(spring)). Each model gets --engines
// loops; all loops share --kv-cache-memory.
func buildStackFor(cfg stackConfig, m, spring *model.Model) (*stack, error) {
	configureKernels(cfg)
	backend := cfg.resolveBackend()
	cfg.resolveLimits(backend)
	s := &stack{Config: cfg, Model: m, Spring: spring}
	s.Kind = backend
	n := enginesFor(backend, cfg.Engines)
	s.Config.Engines = n
	models := []*model.Model{m}
	if spring != nil {
		models = append(models, spring)
	}
	groups := make([][]engine.Engine, len(models)) // [model][loop]
	fail := func(err error) (*stack, error) {      // s.Engine is not set yet
		for _, g := range groups {
			for _, e := range g {
				e.Close()
			}
		}
		s.Close()
		return nil, err
	}
	for mi, mm := range models {
		for j := range n {
			b, err := newBackend(backend, cfg, mm, mi*n+j, len(models)*n)
			if err != nil {
				return fail(err)
			}
			e, err := newEngine(cfg, b)
			if err != nil {
				b.Close()
				return fail(err)
			}
			s.Backends = append(s.Backends, b)
			groups[mi] = append(groups[mi], e)
		}
	}
	s.Backend = s.Backends[0]
	s.Config.BlockSize = s.Backend.BlockSize() // the backend resolves 0
	s.Config.SamplesPerCouplet = samplesFor(backend, cfg.SamplesPerCouplet)
	s.Config.IdleSamples = byBackend(backend, cfg.IdleSamples, cpuDefaultIdleSamples, cudaDefaultIdleSamples)
	s.Config.FinishSamples = byBackend(backend, cfg.FinishSamples, cpuDefaultFinishSamples, cudaDefaultFinishSamples)
	s.Config.noKeep = noKeepFor(backend, cfg.Experimental)
	cfg.SamplesPerCouplet, cfg.IdleSamples, cfg.FinishSamples = s.Config.SamplesPerCouplet, s.Config.IdleSamples, s.Config.FinishSamples
	group := func(es []engine.Engine) engine.Engine {
		e := es[0]
		if len(es) > 1 {
			e = engine.NewShards(es...)
		}
		if cfg.wrapEngine != nil {
			e = cfg.wrapEngine(e)
		}
		return e
	}
	s.lower = group(groups[0])
	s.Engine = s.lower
	if spring != nil {
		s.style = group(groups[1])
		s.Engine = engine.NewShards(s.lower, s.style)
	}
	var err error
	s.Gen, err = s.newGenerator()
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("couplet generator: %w", err)
	}
	return s, nil
}

// newGenerator builds a couplet generator on the stack's engines: the
// configured options, then extra; with a spring model the blessing modes
// run on its loops.
func (s *stack) newGenerator(extra ...couplet.Option) (*couplet.Generator, error) {
	opts := s.Config.generatorOptions()
	if s.style != nil {
		opts = append(opts, couplet.WithStyleEngine(s.style))
	}
	return couplet.New(s.Model, s.lower, append(opts, extra...)...)
}

// cpuBF16Dot resolves --cpu-precision into forward.CPUOptions.BF16Dot:
// "auto" rounds the GEMM inputs to bf16 only where VDPBF16PS makes
// that faster (docs/DECISIONS.md, "bf16 GEMM inputs").
func (c stackConfig) cpuBF16Dot() bool {
	return c.CPUPrecision == "bf16" || (c.CPUPrecision == "auto" && cpu.HasBF16Dot())
}

// lowerBackend is the forward pass of eval's BLEU and perplexity: a
// backend of its own of the kind, weights and precision the stack serves
// with.
func (s *stack) lowerBackend() quality.LowerBackend {
	if s.Kind != "cuda" {
		return quality.CPULower(s.Config.Experimental.Has(featCPUInt8), s.Config.cpuBF16Dot())
	}
	return quality.LowerBackend{Name: "CUDA, " + s.Config.CUDA.Precision + " GEMMs", New: func(m *model.Model, bs, kvTokens int) (forward.Backend, error) {
		cfg := s.Config
		cfg.BlockSize = bs
		return newCUDABackend(cfg, m, int64(kvTokens)*forward.KVBytesPerToken(m.Config), 0, 1)
	}}
}

// newBackend builds engine loop i's backend (of n): each takes 1/n of the
// KV cache memory.
func newBackend(backend string, cfg stackConfig, m *model.Model, i, n int) (forward.Backend, error) {
	var (
		b   forward.Backend
		err error
	)
	kv := int64(cfg.KVCacheBytes) / int64(n)
	switch backend {
	case "cpu":
		b, err = forward.NewCPU(m, forward.CPUOptions{
			BlockSize:    cfg.BlockSize,
			KVCacheBytes: kv,
			Int8:         cfg.Experimental.Has(featCPUInt8),
			BF16Dot:      cfg.cpuBF16Dot(),
		})
	case "cuda":
		b, err = newCUDABackend(cfg, m, kv, i, n) // stack_cuda.go
	}
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	return b, nil
}

// newEngine builds the configured engine on b.
func newEngine(cfg stackConfig, b forward.Backend) (engine.Engine, error) {
	if cfg.Engine == "naive" {
		return engine.NewNaive(b), nil
	}
	e, err := engine.New(b, engine.Config{
		MaxNumSeqs:          cfg.MaxNumSeqs,
		MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
		MaxQueue:            cfg.MaxQueue,
		EnablePrefixCaching: cfg.PrefixCaching,
	})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	return e, nil
}

// resolveBackend turns --backend auto into cpu or cuda (probing the CUDA
// driver once: resolve it before building when the result matters
// earlier, as serve's HTTP defaults do).
func (c *stackConfig) resolveBackend() string {
	if c.Backend != "auto" {
		return c.Backend
	}
	if autoBackendIsCUDA(*c) {
		return "cuda"
	}
	return "cpu"
}

// kvBlocks is the KV cache blocks of all backends.
func (s *stack) kvBlocks() int {
	n := 0
	for _, b := range s.Backends {
		n += b.NumBlocks()
	}
	return n
}

// Close stops the engine (requests still running get engine.ErrClosed) and
// frees the backend's cache.
func (s *stack) Close() error {
	var errs []error
	if s.Engine != nil {
		errs = append(errs, s.Engine.Close())
	}
	for _, b := range s.Backends {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}

// byteSize is a pflag.Value for byte counts with binary suffixes.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

// Type names the value in help ("--kv-cache-memory bytes").
func (b *byteSize) Type() string { return "bytes" }

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

// --experimental=a,b (Prometheus' --enable-feature style),
// the one switch for behaviour that is useful but not the default. A name
// not in featureDocs is an error that lists the known ones.

// The experimental features.
const (
	// featCPUInt8 runs the CPU backend's GEMMs of 1..256 rows on int8
	// copies of the weights (per-row scales): faster decode, logits that
	// differ from bf16 (forward.CPUOptions.Int8; docs/DECISIONS.md).
	featCPUInt8 = "cpu-int8"
	// featCUDAEager runs every CUDA step eagerly, without CUDA graphs
	// (cuda.Options.EagerOnly): slower, but a kernel profiler can then
	// attribute the served kernel mix, which graph capture hides from it.
	featCUDAEager = "cuda-eager"
	// featCUDAKeep lets the couplet generator keep samples on the CUDA
	// backend (couplet.WithKeptSamples), off there by default.
	featCUDAKeep = "cuda-keep"
	// featCUDAGateUp16 has the CUDA backend's gate/up GEMM write bf16
	// (cuda.Options.GateUpBF16).
	featCUDAGateUp16 = "cuda-gu16"
	// featCUDAFusedMLP runs the CUDA backend's gate/up GEMM and SiLU·up as
	// one tensor-core kernel (cuda.Options.FusedMLP).
	featCUDAFusedMLP = "cuda-fused-mlp"
	// featCUDAFusedMLPNorm is featCUDAFusedMLP with the MLP's RMSNorm in
	// the same kernel (cuda.Options.FusedMLPNorm).
	featCUDAFusedMLPNorm = "cuda-fused-mlp-norm"
	// featCUDAFusedQKVNorm runs the CUDA backend's attention RMSNorm and
	// QKV projection as one tensor-core kernel (cuda.Options.FusedQKVNorm).
	featCUDAFusedQKVNorm = "cuda-fused-qkv-norm"
	// featCUDAFineGraphs pads CUDA graph steps to finer token buckets
	// (cuda.Options.FineGraphBuckets).
	featCUDAFineGraphs = "cuda-fine-graphs"
)

// featureDocs describes every known feature (help text and validation).
var featureDocs = map[string]string{
	featCPUInt8:          "CPU backend: small-batch GEMMs on int8 weight copies (faster decode, logits differ from bf16)",
	featCUDAEager:        "CUDA backend: no CUDA graphs, every step launched eagerly (slower; for kernel profilers such as ncu)",
	featCUDAFineGraphs:   "CUDA backend: CUDA-graph steps padded to finer token buckets (less padding computed, more graphs captured)",
	featCUDAFusedMLP:     "CUDA backend: the MLP's gate/up GEMM and SiLU·up in one tensor-core kernel (no float32 gate/up activations in memory, no silu_mul launch)",
	featCUDAFusedMLPNorm: "CUDA backend: cuda-fused-mlp with the MLP's RMSNorm folded into the same kernel (one launch a layer fewer)",
	featCUDAFusedQKVNorm: "CUDA backend: the attention's RMSNorm and QKV projection in one tensor-core kernel (one launch a layer fewer)",
	featCUDAGateUp16:     "CUDA backend: the MLP's gate/up GEMM writes bf16 (half the bytes of its output; values rounded before SiLU·up)",
	featCUDAKeep:         "CUDA backend: continue a couplet's requests from kept samples instead of the prefix cache (serves less with several engine loops)",
}

// knownFeatures lists the feature names for help and errors.
func knownFeatures() string {
	names := make([]string, 0, len(featureDocs))
	for n, d := range featureDocs {
		names = append(names, n+" ("+d+")")
	}
	sort.Strings(names)
	return strings.Join(names, "; ")
}

// features is the pflag.Value of --experimental: a validated set of names.
// Repeating the flag adds to the set.
type features []string

func (f *features) String() string { return strings.Join(*f, ",") }

// Type names the value in help.
func (f *features) Type() string { return "names" }

// Set adds the comma-separated names in s; an unknown name is an error.
func (f *features) Set(s string) error {
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if _, ok := featureDocs[n]; !ok {
			return fmt.Errorf("unknown experimental feature %q (known: %s)", n, knownFeatures())
		}
		if !slices.Contains(*f, n) {
			*f = append(*f, n)
		}
	}
	return nil
}

// Has reports whether feature name is on.
func (f features) Has(name string) bool { return slices.Contains(f, name) }
