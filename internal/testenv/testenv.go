// Package testenv is the one place where test binaries read the
// environment to pick a CPU kernel path; library code never imports it.
package testenv

import (
	"os"
	"testing"
)

// Main is TestMain of a package whose results depend on the CPU kernel
// path: it applies CHUNLIAN_GEMM (openblas | asm | go) through
// setGEMMPath (cpu.SetGEMMPath, as the command line's --cpu-gemm does),
// runs the tests and exits with their status. CI runs such packages once
// per path, with -count=1: go test's cache does not see an environment
// read before m.Run.
func Main(m *testing.M, setGEMMPath func(string)) {
	if v := os.Getenv("CHUNLIAN_GEMM"); v != "" {
		setGEMMPath(v)
	}
	os.Exit(m.Run())
}
