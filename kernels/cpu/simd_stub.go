package cpu

// Placeholder until the archsimd kernels land.
func simdAvailable() bool                               { return false }
func gemmSIMD(m, n, k int, x, w, y []float32, acc bool) { gemmGo(m, n, k, x, w, y, acc) }
