package couplet

import (
	"os"
	"testing"

	"chunlian/kernels/cpu"
)

// TestMain applies CHUNLIAN_GEMM (openblas | simd | go) to the kernels, as
// the command line's --cpu-gemm does: CI runs this package's tests on each
// path (with -count=1: go test's cache does not see an environment
// read before m.Run). The library itself reads no environment.
func TestMain(m *testing.M) {
	if v := os.Getenv("CHUNLIAN_GEMM"); v != "" {
		cpu.SetGEMMPath(v)
	}
	os.Exit(m.Run())
}
