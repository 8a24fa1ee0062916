//go:build !(goexperiment.simd && amd64)

package cpu

// Built without GOEXPERIMENT=simd (or not on amd64): GemmBF16 runs the
// plain-Go kernel.
func bf16SIMDAvailable() bool { return false }

func bf16SIMDImpl() bf16Impl { return bf16Impl{gemmBF16GoRect, false} }
