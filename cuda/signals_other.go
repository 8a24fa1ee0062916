//go:build !linux

package cuda

// fixSignalStacks is a no-op where the CUDA libraries are not loaded
// (see signals_linux.go).
func fixSignalStacks() int { return 0 }
