package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/pflag"

	"chunlian/couplet"
	"chunlian/cuda"
	"chunlian/engine"
	"chunlian/forward"
	"chunlian/kernels/cpu"
	"chunlian/model"
	"chunlian/server"
)

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "123", want: 123},
		{in: "64MiB", want: 64 << 20},
		{in: "64M", want: 64 << 20},
		{in: "64mb", want: 64 << 20},
		{in: "1.5GiB", want: 3 << 29},
		{in: "512k", want: 512 << 10},
		{in: " 2 GiB ", want: 2 << 30},
		{in: "100B", want: 100},
		{in: "", bad: true},
		{in: "abc", bad: true},
		{in: "-1", bad: true},
		{in: "MiB", bad: true},
		{in: "1.2.3M", bad: true},
		{in: "64 PiB", bad: true},
	} {
		var b byteSize
		err := b.Set(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: accepted as %d", tc.in, b)
			}
			continue
		}
		if err != nil || int64(b) != tc.want {
			t.Errorf("%q = %d, %v; want %d", tc.in, b, err, tc.want)
		}
	}
}

// parseStack registers the stack flags (as serve has them) on a fresh
// FlagSet, parses args and binds the environment. An env error fails the
// test unless envErr is given, which then receives it.
func parseStack(t *testing.T, args ...string) stackConfig {
	t.Helper()
	c, err := parseStackEnv(args...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func parseStackEnv(args ...string) (stackConfig, error) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var c stackConfig
	c.registerModel(fs)
	c.registerEngine(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	return c, bindEnv(fs)
}

// flag > env > default.
func TestStackConfigPrecedence(t *testing.T) {
	t.Setenv("CHUNLIAN_MAX_QUEUE", "7")
	t.Setenv("CHUNLIAN_ENGINE", "naive")
	t.Setenv("CHUNLIAN_KV_CACHE_MEMORY", "8MiB")
	t.Setenv("CHUNLIAN_PREFIX_CACHING", "false")
	c := parseStack(t, "--max-queue", "9", "--kv-cache-memory", "16MiB")
	if c.MaxQueue != 9 || c.KVCacheBytes != 16<<20 {
		t.Errorf("flags did not win over env: %+v", c)
	}
	if c.Engine != "naive" || c.PrefixCaching {
		t.Errorf("env did not win over defaults: %+v", c)
	}
	if d := defaultStackConfig(); c.BlockSize != d.BlockSize || c.MaxNumSeqs != d.MaxNumSeqs || c.Backend != d.Backend {
		t.Errorf("defaults lost: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("valid config rejected: %v", err)
	}
}

func TestStackConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		env  [2]string
		args []string
		want string
	}{
		{args: []string{"--engine", "turbo"}, want: "--engine"},
		{args: []string{"--backend", "tpu"}, want: "--backend"},
		{args: []string{"--block-size", "-1"}, want: "--block-size"},
		{args: []string{"--block-size", "1025"}, want: "--block-size"},
		{args: []string{"--max-num-seqs", "-1"}, want: "--max-num-seqs"},
		{args: []string{"--max-num-batched-tokens", "-3"}, want: "--max-num-batched-tokens"},
		{args: []string{"--max-queue", "-1"}, want: "--max-queue"},
		{args: []string{"--threads", "-2"}, want: "--threads"},
		{args: []string{"--samples-per-couplet", "33"}, want: "--samples-per-couplet"},
		{args: []string{"--banner-candidates", "-1"}, want: "--banner-candidates"},
		{args: []string{"--gpu-max-blocks", "-2"}, want: "--gpu-max-blocks"},
		{env: [2]string{"CHUNLIAN_SAMPLES_PER_COUPLET", "two"}, want: "CHUNLIAN_SAMPLES_PER_COUPLET"},
		{args: []string{"--model", "/nonexistent/model/dir"}, want: "--model"},
		{args: []string{"--spring-model", "/nonexistent/model/dir"}, want: "--spring-model"},
		{env: [2]string{"CHUNLIAN_MAX_QUEUE", "lots"}, want: "CHUNLIAN_MAX_QUEUE"},
		{env: [2]string{"CHUNLIAN_KV_CACHE_MEMORY", "big"}, want: "CHUNLIAN_KV_CACHE_MEMORY"},
		{env: [2]string{"CHUNLIAN_PREFIX_CACHING", "maybe"}, want: "CHUNLIAN_PREFIX_CACHING"},
		{env: [2]string{"CHUNLIAN_EXPERIMENTAL", "warp-drive"}, want: "CHUNLIAN_EXPERIMENTAL"},
		{args: []string{"--experimental", "cpu-int8,warp-drive"}, want: "warp-drive"},
		{args: []string{"--cpu-gemm", "fortran"}, want: "--cpu-gemm"},
		{args: []string{"--cpu-precision", "fp16"}, want: "--cpu-precision"},
		{args: []string{"--default-temperature", "3"}, want: "--default-temperature"},
		{args: []string{"--default-temperature", "0"}, want: "--default-temperature"},
	} {
		if tc.env[0] != "" {
			t.Setenv(tc.env[0], tc.env[1])
		}
		c, err := parseStackEnv(tc.args...)
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: error %v, want one naming %s", tc.env, tc.args, err, tc.want)
		}
		if tc.env[0] != "" {
			os.Unsetenv(tc.env[0]) // t.Setenv restores the original at the end
		}
	}
}

// --experimental=cpu-int8 reaches the CPU backend: its small-batch GEMMs
// run on int8 weight copies only with it.
func TestCPUInt8Flag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--backend", "cpu"}, false},
		{[]string{"--backend", "cpu", "--experimental=cpu-int8"}, true},
	} {
		c := parseStack(t, append(tc.args, "--kv-cache-memory", "1MiB", "--threads", "1")...)
		st, err := buildStackFor(c, model.NewRandom(model.TestConfig(), 3), nil)
		if err != nil {
			t.Fatal(err)
		}
		cb, ok := st.Backend.(*forward.CPU)
		if !ok {
			t.Fatalf("%v: backend %T, want *forward.CPU", tc.args, st.Backend)
		}
		if got := cb.UsesInt8(); got != tc.want {
			t.Errorf("%v: UsesInt8 = %v, want %v", tc.args, got, tc.want)
		}
		// The random model has no bf16 copies: fp32 unless cpu-int8.
		if k, w := cb.Kernels(), map[bool]string{true: " weights=int8", false: " weights=fp32"}[tc.want]; !strings.HasSuffix(k, w) {
			t.Errorf("%v: Kernels() = %q, want suffix %q", tc.args, k, w)
		}
		st.Close()
	}
}

// --cpu-precision reaches the CPU backend (a model stored in bf16, so that
// the bf16 path it changes is on): auto rounds only where VDPBF16PS is.
func TestCPUPrecisionFlag(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 3)
	m.Weights.RoundToBF16()
	if !m.Weights.BuildBF16() {
		t.Fatal("no bf16 copies after rounding")
	}
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--backend", "cpu", "--cpu-precision", "fp32"}, false},
		{[]string{"--backend", "cpu"}, cpu.HasFastBF16() && cpu.HasBF16Dot()},
		{[]string{"--backend", "cpu", "--cpu-precision", "bf16"}, cpu.HasFastBF16()},
	} {
		c := parseStack(t, append(tc.args, "--kv-cache-memory", "1MiB", "--threads", "1")...)
		st, err := buildStackFor(c, m, nil)
		if err != nil {
			t.Fatal(err)
		}
		cb, ok := st.Backend.(*forward.CPU)
		if !ok {
			t.Fatalf("%v: backend %T, want *forward.CPU", tc.args, st.Backend)
		}
		if got := cb.UsesBF16Dot(); got != tc.want {
			t.Errorf("%v: UsesBF16Dot = %v, want %v", tc.args, got, tc.want)
		}
		if got := st.lowerBackend().Name; tc.want != strings.Contains(got, "bf16") {
			t.Errorf("%v: eval's forward pass %q", tc.args, got)
		}
		st.Close()
	}
}

// The stack builds and generates on the random model with both engines.
func TestBuildStackRandomModel(t *testing.T) {
	for _, eng := range []string{"paged", "naive"} {
		t.Run(eng, func(t *testing.T) {
			c := parseStack(t, "--engine", eng, "--backend", "cpu", "--kv-cache-memory", "1MiB", "--threads", "1")
			st, err := buildStackFor(c, model.NewRandom(model.TestConfig(), 3), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if st.Backend.NumBlocks()*st.Backend.BlockSize() == 0 {
				t.Fatal("empty KV cache")
			}
			cs, err := st.Gen.Generate(context.Background(), couplet.Request{Text: "平安", Seed: 5})
			if err != nil || len(cs) == 0 {
				t.Fatalf("generate: %v", err)
			}
			if r := couplet.Check(cs[0].Upper, cs[0].Lower, cs[0].Banner); !r.Rule1() {
				t.Errorf("malformed couplet %+v", cs[0])
			}
		})
	}
}

// --engines 2 builds two backends, each with half the KV cache, behind one
// sharded engine that serves concurrent couplets.
func TestBuildStackTwoEngines(t *testing.T) {
	one := parseStack(t, "--backend", "cpu", "--kv-cache-memory", "2MiB", "--threads", "1")
	st1, err := buildStackFor(one, model.NewRandom(model.TestConfig(), 3), nil)
	if err != nil {
		t.Fatal(err)
	}
	blocks := st1.kvBlocks()
	st1.Close()
	c := parseStack(t, "--backend", "cpu", "--kv-cache-memory", "2MiB", "--threads", "1", "--engines", "2")
	st, err := buildStackFor(c, model.NewRandom(model.TestConfig(), 3), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sh, ok := st.Engine.(*engine.Shards)
	if len(st.Backends) != 2 || !ok || sh.Len() != 2 || st.Config.Engines != 2 {
		t.Fatalf("--engines 2: %d backends, engine %T", len(st.Backends), st.Engine)
	}
	for i, b := range st.Backends {
		if got := b.NumBlocks(); got < blocks/2-1 || got > blocks/2+1 {
			t.Errorf("backend %d: %d KV blocks, want about half of one engine's %d", i, got, blocks)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := st.Gen.Generate(context.Background(), couplet.Request{Text: "平安", Seed: uint64(i + 1)})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("generate: %v", err)
		}
	}
	if s := st.Engine.Stats(); s.Steps == 0 || s.KVBlocksTotal != st.kvBlocks() {
		t.Errorf("sharded stats %+v: want steps and %d KV blocks", s, st.kvBlocks())
	}
}

// --block-size 0 (the default) is the backend's own default
// (forward.DefaultCPUBlockSize on the CPU); a positive flag wins. The
// stack's config then holds the size the backend and engine use.
func TestBlockSize(t *testing.T) {
	// The stack passes the resolved size to the backend and the engine.
	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, forward.DefaultCPUBlockSize},
		{[]string{"--block-size", "16"}, 16},
	} {
		c := parseStack(t, append(tc.args, "--backend", "cpu", "--kv-cache-memory", "1MiB", "--threads", "1")...)
		st, err := buildStackFor(c, model.NewRandom(model.TestConfig(), 3), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Backend.BlockSize(); got != tc.want || st.Config.BlockSize != tc.want {
			t.Errorf("%v: backend block size %d, config %d, want %d", tc.args, got, st.Config.BlockSize, tc.want)
		}
		if _, err := st.Gen.Generate(context.Background(), couplet.Request{Text: "平安", Seed: 5}); err != nil {
			t.Errorf("%v: generate: %v", tc.args, err)
		}
		st.Close()
	}
}

// TestResolveLimits: --max-num-seqs and --max-num-batched-tokens left at 0
// take the backend's step limits (the engine's defaults on the CPU, wide
// ones on the GPU); set values win, and buildStack passes the resolved
// ones on.
func TestResolveLimits(t *testing.T) {
	e := engine.DefaultConfig()
	for _, tc := range []struct {
		backend            string
		seqs, tokens       int
		wantSeqs, wantToks int
	}{
		{"cpu", 0, 0, e.MaxNumSeqs, e.MaxNumBatchedTokens},
		{"cuda", 0, 0, cudaDefaultMaxNumSeqs, cudaDefaultMaxNumBatchedTokens},
		{"cuda", 64, 0, 64, cudaDefaultMaxNumBatchedTokens},
		{"cpu", 0, 512, e.MaxNumSeqs, 512},
	} {
		c := defaultStackConfig()
		c.MaxNumSeqs, c.MaxNumBatchedTokens = tc.seqs, tc.tokens
		c.resolveLimits(tc.backend)
		if c.MaxNumSeqs != tc.wantSeqs || c.MaxNumBatchedTokens != tc.wantToks {
			t.Errorf("%s %d/%d: resolved %d/%d, want %d/%d", tc.backend, tc.seqs, tc.tokens, c.MaxNumSeqs, c.MaxNumBatchedTokens, tc.wantSeqs, tc.wantToks)
		}
	}
	if cudaDefaultMaxNumSeqs <= e.MaxNumSeqs || cudaDefaultMaxNumBatchedTokens <= e.MaxNumBatchedTokens {
		t.Errorf("the GPU's step limits are not wider than the CPU's")
	}
	c := defaultStackConfig()
	c.Backend = "cpu"
	st, err := buildStackFor(c, model.NewRandom(model.TestConfig(), 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Config.MaxNumSeqs != e.MaxNumSeqs || st.Config.MaxNumBatchedTokens != e.MaxNumBatchedTokens {
		t.Errorf("the stack kept %d/%d, want the CPU's %d/%d", st.Config.MaxNumSeqs, st.Config.MaxNumBatchedTokens, e.MaxNumSeqs, e.MaxNumBatchedTokens)
	}
}

// TestSamplesFor: --samples-per-couplet 0 resolves per backend, a set
// value wins.
func TestSamplesFor(t *testing.T) {
	for _, tc := range []struct {
		backend string
		flag    int
		want    int
	}{{"cpu", 0, cpuDefaultSamples}, {"cuda", 0, cudaDefaultSamples}, {"cpu", 2, 2}, {"cuda", 1, 1}} {
		if got := samplesFor(tc.backend, tc.flag); got != tc.want {
			t.Errorf("samplesFor(%s, %d) = %d, want %d", tc.backend, tc.flag, got, tc.want)
		}
	}
}

// TestCUDAMaxBlocks: by default each engine's cache holds cudaCacheTokens
// at any block size; --gpu-max-blocks N caps it at N blocks, 0 not at all.
func TestCUDAMaxBlocks(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		blockSize  int
		wantBlocks int
	}{
		{nil, cuda.DefaultBlockSize, cudaCacheTokens / cuda.DefaultBlockSize},
		{nil, 4, cudaCacheTokens / 4},
		{nil, 1, cudaCacheTokens},
		{[]string{"--gpu-max-blocks", "1000"}, 2, 1000},
		{[]string{"--gpu-max-blocks", "0"}, 4, 0},
	} {
		if got := parseStack(t, tc.args...).CUDA.maxBlocks(tc.blockSize); got != tc.wantBlocks {
			t.Errorf("%q at %d-token blocks: %d blocks, want %d", tc.args, tc.blockSize, got, tc.wantBlocks)
		}
	}
}

func TestCUDAFlags(t *testing.T) {
	t.Setenv("CHUNLIAN_CUDA_LIB_DIR", "/from/env")
	d := defaultCUDAConfig()
	for _, tc := range []struct {
		args []string
		want cudaConfig
	}{
		{nil, cudaConfig{LibDir: "/from/env", MemoryFraction: d.MemoryFraction, Precision: d.Precision, MaxBlocks: d.MaxBlocks}},
		{[]string{"--cuda-lib-dir", "/x", "--gpu-precision", "fp32", "--gpu-memory-utilization", "0.5", "--gpu-max-blocks", "0", "--cuda-nvrtc-target", "ptx"},
			cudaConfig{LibDir: "/x", NVRTCTarget: "ptx", MemoryFraction: 0.5, Precision: "fp32", MaxBlocks: 0}},
		{[]string{"--gpu-handoff-spin", "-1ns", "--gpu-grouped-attention-from", "-1"},
			cudaConfig{LibDir: "/from/env", MemoryFraction: d.MemoryFraction, Precision: d.Precision, MaxBlocks: d.MaxBlocks, HandoffSpin: -1, GroupedFrom: -1}},
	} {
		if got := parseStack(t, tc.args...).CUDA; got != tc.want {
			t.Errorf("%q: CUDA config %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

// TestBackendCUDAWithoutGPU: --backend cuda fails with the loader's
// explanation where no GPU is usable, and auto falls back to the CPU.
func TestBackendCUDAWithoutGPU(t *testing.T) {
	if ok, _ := cuda.Available(""); ok {
		t.Skip("a CUDA GPU is present: the no-GPU paths do not apply")
	}
	m := model.NewRandom(model.TestConfig(), 3)
	c := parseStack(t, "--backend", "cuda", "--kv-cache-memory", "1MiB")
	if st, err := buildStackFor(c, m, nil); err == nil {
		st.Close()
		t.Fatal("--backend cuda built a stack without a GPU")
	} else if !strings.Contains(err.Error(), "not found") {
		t.Errorf("error does not say what is missing: %v", err)
	}
	c = parseStack(t, "--backend", "auto", "--kv-cache-memory", "1MiB", "--threads", "1")
	st, err := buildStackFor(c, m, nil)
	if err != nil {
		t.Fatalf("--backend auto without a GPU: %v", err)
	}
	defer st.Close()
	if _, ok := st.Backend.(*cuda.Backend); ok {
		t.Error("auto chose CUDA without a GPU")
	}
}

func TestNVMLIndex(t *testing.T) {
	for _, tc := range []struct {
		dev     int
		visible string
		want    int
	}{
		{0, "", 0},
		{3, "", 3},
		{0, "5", 5},
		{1, "4,6", 6},
		{1, " 4, 7 ", 7},
		{0, "GPU-1234abcd", 0}, // UUIDs: same order assumed
		{2, "1", 2},            // out of the list: cuda.New reports the bad ordinal
	} {
		if got := nvmlIndex(tc.dev, tc.visible); got != tc.want {
			t.Errorf("nvmlIndex(%d, %q) = %d, want %d", tc.dev, tc.visible, got, tc.want)
		}
	}
}

func TestDeviceFlag(t *testing.T) {
	// The CHUNLIAN_DEVICE binding is TestEveryFlagHasEnv's.
	for _, tc := range []struct {
		flag    string
		want    int
		wantErr bool
	}{
		{"", 0, false},
		{"3", 3, false},
		{"-1", 0, true},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var c stackConfig
		c.registerModel(fs)
		var args []string
		if tc.flag != "" {
			args = []string{"--device", tc.flag}
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), "--device") {
				t.Errorf("flag %q: %v, want an error naming --device", tc.flag, err)
			}
			continue
		}
		if err != nil || c.CUDA.Device != tc.want {
			t.Errorf("flag %q: device %d err %v, want %d", tc.flag, c.CUDA.Device, err, tc.want)
		}
	}
}

// --default-temperature (couplet.DefaultTemperature unless given) is the
// temperature of requests that set none; the stack's config holds it.
func TestDefaultTemperature(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want float64
	}{
		{nil, couplet.DefaultTemperature},
		{[]string{"--default-temperature", "0.9"}, 0.9},
	} {
		c := parseStack(t, append(tc.args, "--backend", "cpu", "--kv-cache-memory", "1MiB", "--threads", "1")...)
		st, err := buildStackFor(c, model.NewRandom(model.TestConfig(), 3), nil)
		if err != nil {
			t.Fatal(err)
		}
		if st.Config.DefaultTemperature != tc.want {
			t.Errorf("%v: default temperature %g, want %g", tc.args, st.Config.DefaultTemperature, tc.want)
		}
		st.Close()
	}
}

// A spring model gets loops of its own: keyword requests run there, lower
// mode on --model's, and the stack's Engine sums both for its stats.
func TestBuildStackSpring(t *testing.T) {
	c := parseStack(t, "--backend", "cpu", "--kv-cache-memory", "2MiB", "--threads", "1")
	st, err := buildStackFor(c, model.NewRandom(model.TestConfig(), 3), model.NewRandom(model.TestConfig(), 4))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if len(st.Backends) != 2 || st.lower == nil || st.style == nil {
		t.Fatalf("%d backends, lower %v, style %v: want one loop per model", len(st.Backends), st.lower, st.style)
	}
	steps := func() (lower, style int64) { return st.lower.Stats().Steps, st.style.Stats().Steps }
	if _, err := st.Gen.Generate(context.Background(), couplet.Request{Text: "平安", Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if l, s := steps(); l != 0 || s == 0 {
		t.Errorf("keyword request: %d steps on --model's loop, %d on the spring model's; want 0 and > 0", l, s)
	}
	_, s0 := steps()
	if _, err := st.Gen.Generate(context.Background(), couplet.Request{Mode: couplet.ModeLower, Text: "春回大地", Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if l, s := steps(); l == 0 || s != s0 {
		t.Errorf("lower request: %d steps on --model's loop, spring model's %d → %d; want > 0 and unchanged", l, s0, s)
	}
	if l, s := steps(); st.Engine.Stats().Steps != l+s || st.Engine.Stats().KVBlocksTotal != st.kvBlocks() {
		t.Errorf("stack stats %+v: want %d steps and %d KV blocks", st.Engine.Stats(), l+s, st.kvBlocks())
	}
}

// Each experimental CUDA feature is known to --experimental and sets its
// cuda.Options field, and only that one (no GPU needed).
func TestCUDAFeatureOptions(t *testing.T) {
	base := cudaOptions(parseStack(t), 0, 0, 1)
	for _, tc := range []struct {
		feature string
		set     func(*cuda.Options)
	}{
		{featCUDAEager, func(o *cuda.Options) { o.EagerOnly = true }},
		{featCUDAGateUp16, func(o *cuda.Options) { o.GateUpBF16 = true }},
		{featCUDAFusedMLP, func(o *cuda.Options) { o.FusedMLP = true }},
		{featCUDAFusedMLPNorm, func(o *cuda.Options) { o.FusedMLPNorm = true }},
		{featCUDAFusedQKVNorm, func(o *cuda.Options) { o.FusedQKVNorm = true }},
		{featCUDAFineGraphs, func(o *cuda.Options) { o.FineGraphBuckets = true }},
	} {
		c, err := parseStackEnv("--experimental", tc.feature)
		if err != nil {
			t.Errorf("--experimental %s: %v", tc.feature, err)
			continue
		}
		want := base
		tc.set(&want)
		if got := cudaOptions(c, 0, 0, 1); got != want {
			t.Errorf("--experimental %s: options %+v, want %+v", tc.feature, got, want)
		}
	}
}

// --experimental cuda-eager reaches the CUDA backend: its steps run
// without graphs, and without the feature they replay graphs.
func TestCUDAEagerFeature(t *testing.T) {
	if ok, _ := cuda.Available(""); !ok {
		t.Skip("no CUDA GPU here")
	}
	for _, eager := range []bool{false, true} {
		args := []string{"--backend", "cuda", "--kv-cache-memory", "64MiB", "--engines", "1"}
		if eager {
			args = append(args, "--experimental", "cuda-eager")
		}
		st, err := buildStackFor(parseStack(t, args...), model.NewRandom(model.TestConfig(), 3), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Gen.Generate(context.Background(), couplet.Request{Text: "平安", Seed: 1}); err != nil {
			st.Close()
			t.Fatal(err)
		}
		gs := st.Backend.(*cuda.Backend).GraphStats()
		st.Close()
		if eager && gs.Launches != 0 || !eager && gs.Launches == 0 {
			t.Errorf("cuda-eager %v: %d graph launches", eager, gs.Launches)
		}
	}
}

// buildStack loads --spring-model DIR beside --model DIR, and refuses one
// whose tokenizer differs, naming the flag.
func TestSpringModelDir(t *testing.T) {
	base, spring, other := t.TempDir(), t.TempDir(), t.TempDir()
	for dir, seed := range map[string]int64{base: 1, spring: 2, other: 3} {
		if err := model.WriteDir(model.NewRandom(model.TestConfig(), seed), dir); err != nil {
			t.Fatal(err)
		}
	}
	tok := filepath.Join(other, "tokenizer.json")
	b, err := os.ReadFile(tok)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tok, []byte(strings.Replace(string(b), `"春"`, `"X"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--backend", "cpu", "--kv-cache-memory", "2MiB", "--threads", "1", "--model", base}
	st, err := buildStack(parseStack(t, append(args, "--spring-model", spring)...))
	if err != nil {
		t.Fatal(err)
	}
	if st.Spring == nil || st.style == nil || len(st.Backends) != 2 {
		t.Errorf("--spring-model DIR: spring %v, %d backends", st.Spring, len(st.Backends))
	}
	st.Close()
	for _, sm := range []string{"", "off"} {
		st, err := buildStack(parseStack(t, append(args, "--spring-model", sm)...))
		if err != nil {
			t.Fatal(err)
		}
		if st.Spring != nil || len(st.Backends) != 1 {
			t.Errorf("--model DIR --spring-model %q: spring %v, %d backends; want --model's alone", sm, st.Spring, len(st.Backends))
		}
		st.Close()
	}
	if st, err := buildStack(parseStack(t, append(args, "--spring-model", other)...)); err == nil {
		st.Close()
		t.Error("a spring model with another tokenizer was accepted")
	} else if !strings.Contains(err.Error(), "--spring-model") || !strings.Contains(err.Error(), "tokenizer") {
		t.Errorf("error %v, want one naming --spring-model and the tokenizer", err)
	}
}

// TestServedStackKeeps: the engines serve hands the couplet generator,
// wrapped by the metrics decorator, still keep samples (engine.Keeper),
// and the CPU stack's generator uses them; on CUDA it does not by
// default.
func TestServedStackKeeps(t *testing.T) {
	c := parseStack(t, "--backend", "cpu", "--kv-cache-memory", "2MiB", "--threads", "1")
	c.wrapEngine = new(server.Metrics).InstrumentEngine
	st, err := buildStackFor(c, model.NewRandom(model.TestConfig(), 3), model.NewRandom(model.TestConfig(), 4))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for name, e := range map[string]engine.Engine{"lower": st.lower, "style": st.style} {
		if _, ok := e.(engine.Keeper); !ok {
			t.Errorf("the %s engine (%T) does not keep samples", name, e)
		}
	}
	if st.Config.noKeep {
		t.Error("the CPU stack's generator does not keep samples")
	}
	// On CUDA only with the experimental feature.
	for _, tc := range []struct {
		backend string
		exp     features
		want    bool
	}{{"cpu", nil, false}, {"cuda", nil, true}, {"cuda", features{featCUDAKeep}, false}} {
		if got := noKeepFor(tc.backend, tc.exp); got != tc.want {
			t.Errorf("noKeepFor(%s, %v) = %v, want %v", tc.backend, tc.exp, got, tc.want)
		}
	}
}
