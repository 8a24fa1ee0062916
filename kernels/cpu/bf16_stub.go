//go:build !(goexperiment.simd && amd64)

package cpu

// Built without GOEXPERIMENT=simd (or not on amd64): GemmBF16 runs the
// plain-Go kernel.
func bf16SIMDAvailable() bool { return false }

var gemmBF16SIMDRect bf16Kernel = gemmBF16GoRect
