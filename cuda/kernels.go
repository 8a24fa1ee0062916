package cuda

import (
	_ "embed"
	"fmt"
)

// llamaSource is the CUDA C of every kernel; see kernels/llama.cu for each
// kernel's launch shape and buffer shapes.
//
//go:embed kernels/llama.cu
var llamaSource string

// kernelNames are the entry points resolved after loading the module.
var kernelNames = []string{"embed_gather", "rmsnorm", "rope_kv", "paged_attention", "silu_mul", "copy_blocks"}

// kernelOptions are the NVRTC options for a model with this head dimension.
func kernelOptions(headDim int) []string {
	return []string{fmt.Sprintf("-DHEAD_DIM=%d", headDim), "-lineinfo"}
}

// archFor names the NVRTC target for a compute capability: real machine
// code (CUBIN) for the device itself.
func archFor(major, minor int) string { return fmt.Sprintf("sm_%d%d", major, minor) }
