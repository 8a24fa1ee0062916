package cpu

// Placeholder until the purego OpenBLAS loader lands.
func blasAvailable() bool                               { return false }
func setBLASThreads(int)                                {}
func gemmBLAS(m, n, k int, x, w, y []float32, acc bool) { gemmGo(m, n, k, x, w, y, acc) }
