//go:build !(goexperiment.simd && amd64)

package cpu

// Built without GOEXPERIMENT=simd (or not on amd64): no SIMD path.
func simdAvailable() bool                               { return false }
func gemmSIMD(m, n, k int, x, w, y []float32, acc bool) { gemmGo(m, n, k, x, w, y, acc) }

func simdVariants() []string                 { return nil }
func setSIMDVariant(string) (restore func()) { return func() {} }

// simdWide is never set without the SIMD build.
var simdWide = false
