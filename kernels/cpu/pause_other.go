//go:build !amd64

package cpu

// spinPause is a no-op where there is no assembly PAUSE loop (pool.go).
func spinPause(n int) {}
