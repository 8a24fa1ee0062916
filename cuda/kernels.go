package cuda

import (
	_ "embed"
	"fmt"
	"sync"
)

// llamaSource is the CUDA C of every kernel; see kernels/llama.cu for each
// kernel's launch shape and buffer shapes.
//
//go:embed kernels/llama.cu
var llamaSource string

// drawSource holds the device draw's kernels (draw_rows, gather_rows); it
// uses llama.cu's macros and is compiled appended to it.
//
//go:embed kernels/draw.cu
var drawSource string

// gemmSource holds the tensor-core GEMMs with fused prologues and
// epilogues (gemm_gu_silu, gemm_gu_silu_norm, gemm_norm); it uses
// llama.cu's helpers and is compiled appended to it.
//
//go:embed kernels/gemm.cu
var gemmSource string

// kernelSource is the one NVRTC program: llama.cu, draw.cu, then gemm.cu.
var kernelSource = llamaSource + "\n" + drawSource + "\n" + gemmSource

// kernelNames are the entry points resolved after loading the module.
var kernelNames = []string{"embed_gather", "rmsnorm", "silu_mul", "silu_mul16", "copy_blocks", "row_lse",
	"gemv", "gemv_qkv_rope", "gemv_gu_silu", "gemv_bf16", "gemv_qkv_rope_bf16", "gemv_gu_silu_bf16",
	"paged_attention_chunked", "paged_attention_rope", "paged_attention_chunked_g", "paged_attention_rope_g", "draw_rows", "gather_rows", "mark_done", "gemm_gu_silu", "gemm_gu_silu_norm", "gemm_norm"}

// kernelOptions are the NVRTC options for a model with this head dimension.
func kernelOptions(headDim int) []string {
	return []string{fmt.Sprintf("-DHEAD_DIM=%d", headDim), "-lineinfo"}
}

// archFor names the NVRTC target for a compute capability and
// Options.NVRTCTarget: "" or "cubin" — machine code for the exact
// architecture (NVRTC runs its own ptxas); "ptx" — PTX that the driver
// compiles when the module is loaded (its own, usually newer, ptxas;
// cached on disk by the driver). The second is the way around an NVRTC
// that fails on the kernels for a new architecture.
func archFor(major, minor int, target string) string {
	if target == "ptx" {
		return fmt.Sprintf("compute_%d%d", major, minor)
	}
	return fmt.Sprintf("sm_%d%d", major, minor)
}

var (
	compileMu    sync.Mutex
	compileCache = map[string]*compileResult{}
)

// compileCached compiles the kernels once per process for each (arch,
// head dim): NVRTC takes about a second, and tests and benchmarks create
// many backends.
func compileCached(f *nvrtcFns, arch string, headDim int) (*compileResult, error) {
	key := fmt.Sprintf("%s/%d", arch, headDim)
	compileMu.Lock()
	defer compileMu.Unlock()
	if r, ok := compileCache[key]; ok {
		return r, nil
	}
	r, err := f.compileSource("llama.cu", kernelSource, arch, kernelOptions(headDim))
	if err != nil {
		return nil, err
	}
	compileCache[key] = r
	return r, nil
}
