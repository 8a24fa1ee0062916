//go:build amd64

package cpu

//go:generate sh -c "python3 sample_amd64_gen.py > sample_consts_amd64.s"

import "math"

// Softmax and the sampler's kernels (sample.go) in AVX2/FMA assembly
// (sample_amd64.s) for every amd64 build, part of asmElem: as scalar loops
// they dominated the host CPU of the CUDA backend under load. Each
// wrapper hands the first len &^ 7 entries to the assembly and does the
// rest in Go with the same formulas.

//go:noescape
func expSumAVX2(dst, src *float32, n int, scale, shift float32) float64

//go:noescape
func expAVX2(dst, src *float32, n int, scale, shift float32)

//go:noescape
func compactValsAVX2(idx *int32, vals *float32, x *float32, n int, thr float32) (cnt int)

//go:noescape
func scaleAVX2(x *float32, n int, s float32)

//go:noescape
func maxAVX2(x *float32, n int) (m float32, nan bool)

//go:noescape
func findAVX2(x *float32, n int, v float32) int

//go:noescape
func siluMulAVX2(out, gate, up *float32, n int)

//go:noescape
func compactAVX2(idx *int32, x *float32, n int, thr float32) (cnt int, sum float64)

// scanMaxAsm is scanMaxGo: a vector max (NaNs skipped, flagged), then a
// vector search for the first index holding it; the tail in Go.
func scanMaxAsm(x []float32) (m float32, im int, hasNaN bool) {
	n8 := len(x) &^ 7
	if n8 == 0 {
		return scanMaxGo(x)
	}
	m, hasNaN = maxAVX2(&x[0], n8)
	im = -1
	for i := n8; i < len(x); i++ {
		if v := x[i]; v > m {
			m, im = v, i
		} else if v != v {
			hasNaN = true
		}
	}
	switch {
	case im >= 0: // the tail holds the max
	case m > float32(math.Inf(-1)): // in the body: find its first index
		im = findAVX2(&x[0], n8, m)
		m = x[im] // the sign of a zero max is the first zero's
	default: // nothing above -Inf
		im = 0
	}
	return m, im, hasNaN
}

func expSumAsm(dst, src []float32, scale, shift float32) float64 {
	dst = dst[:len(src)]
	n8 := len(src) &^ 7
	var sum float64
	if n8 > 0 {
		sum = expSumAVX2(&dst[0], &src[0], n8, scale, shift)
	}
	for i := n8; i < len(src); i++ {
		e := expf(float32(src[i]*scale) - shift)
		dst[i] = e
		sum += float64(e)
	}
	return sum
}

func expAsm(dst, src []float32, scale, shift float32) {
	dst = dst[:len(src)]
	n8 := len(src) &^ 7
	if n8 > 0 {
		expAVX2(&dst[0], &src[0], n8, scale, shift)
	}
	expGo(dst[n8:], src[n8:], scale, shift)
}

func compactAsm(idx []int32, x []float32, thr float32) (int, float64) {
	idx = idx[:len(x)]
	n8 := len(x) &^ 7
	var n int
	var sum float64
	if n8 > 0 {
		n, sum = compactAVX2(&idx[0], &x[0], n8, thr)
	}
	for i := n8; i < len(x); i++ {
		if v := x[i]; v > thr {
			idx[n] = int32(i)
			n++
			sum += float64(v)
		}
	}
	return n, sum
}

func compactValsAsm(idx []int32, vals, x []float32, thr float32) int {
	idx, vals = idx[:len(x)], vals[:len(x)]
	n8 := len(x) &^ 7
	var n int
	if n8 > 0 {
		n = compactValsAVX2(&idx[0], &vals[0], &x[0], n8, thr)
	}
	for i := n8; i < len(x); i++ {
		if v := x[i]; v > thr {
			idx[n] = int32(i)
			vals[n] = v
			n++
		}
	}
	return n
}

// softmaxAsm is softmaxGo on the kernels above: max, exp and sum in one
// pass, scale. Any NaN (or an all -Inf row) makes every entry NaN, as in
// softmaxGo.
func softmaxAsm(x []float32) {
	n8 := len(x) &^ 7
	if n8 == 0 {
		softmaxGo(x)
		return
	}
	mx, _ := maxAVX2(&x[0], n8)
	for _, v := range x[n8:] {
		mx = max(mx, v)
	}
	inv := float32(1 / expSumAsm(x, x, 1, mx))
	scaleAVX2(&x[0], n8, inv)
	for i := n8; i < len(x); i++ {
		x[i] *= inv
	}
}

// siluMulAsm is siluMulGo with the first len(out)&^7 elements in assembly
// (same formula and order; exp(−g) by the vector exp). It differs from
// siluMulGo only through exp: at most a few ulps (TestSiLUMulAsm).
func siluMulAsm(out, gate, up []float32) {
	gate, up = gate[:len(out)], up[:len(out)]
	n8 := len(out) &^ 7
	if n8 > 0 {
		siluMulAVX2(&out[0], &gate[0], &up[0], n8)
	}
	siluMulGo(out[n8:], gate[n8:], up[n8:])
}
