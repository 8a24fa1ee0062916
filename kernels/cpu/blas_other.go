//go:build !(linux || darwin)

package cpu

// purego is not used on this platform: the Go paths only.
func blasAvailable() bool                               { return false }
func setBLASThreads(int)                                {}
func gemmBLAS(m, n, k int, x, w, y []float32, acc bool) { gemmGo(m, n, k, x, w, y, acc) }
