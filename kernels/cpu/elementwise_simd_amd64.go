//go:build goexperiment.simd && amd64

package cpu

import "simd/archsimd"

// AVX2/FMA versions of the elementwise inner loops. Each ends with
// ClearAVXUpperBits (VZEROUPPER) because the Go compiler's scalar float code
// is SSE-encoded, which on Intel CPUs pays for dirty upper vector halves.
// Each processes 8 floats
// per step (32 for the reductions, with 4 independent accumulators to hide
// FMA latency) and finishes the last len%8 through a zero-padded stack
// buffer (loadPart/storePart). archsimd's own LoadFloat32x8SlicePart and
// StoreSlicePart are not used: in Go 1.26 they convert the short slice to a
// *[8]float32, which -race's checkptr rejects ("converted pointer straddles
// multiple allocations").

// DotsAt and AxpysAt are the assembly ones (their point is one call for
// many vectors, which the assembly loops already make cheap).
// Softmax and the sampler's kernels (sample.go) are the assembly ones
// (same CPU requirement, AVX2+FMA): the archsimd softmax is much slower
// than the assembly (one pass for exp and sum; docs/DECISIONS.md, "Sampler
// kernels in assembly"), and gave a finite row for a row with a NaN where
// softmaxGo gives NaNs.
var simdElem = elemKernels{
	name: "simd", dot: dotSIMD, axpy: axpySIMD, dotsAt: asmElem.dotsAt, axpysAt: asmElem.axpysAt, sumSq: sumSqSIMD, scaleMul: scaleMulSIMD,
	siluMul: siluMulSIMD, add: addSIMD, rope: ropeSIMD, softmax: asmElem.softmax,
	scanMax: asmElem.scanMax, expSum: asmElem.expSum, exp: asmElem.exp, compact: asmElem.compact,
	compactVals: asmElem.compactVals,
}

func init() {
	if !hasAVX2FMA || !asmAVX2 {
		return
	}
	elemSets = append(elemSets, simdElem)
	if !goForced {
		elem = simdElem
	}
}

// loadPart loads len(s) < 8 floats, zero-padded.
func loadPart(s []float32) archsimd.Float32x8 {
	var b [8]float32
	copy(b[:], s)
	return archsimd.LoadFloat32x8(&b)
}

// storePart stores the first len(s) < 8 lanes of v into s.
func storePart(v archsimd.Float32x8, s []float32) {
	var b [8]float32
	v.Store(&b)
	copy(s, b[:])
}

func hsum8(a archsimd.Float32x8) float32 { return hsum1(a) }

func dotSIMD(a, b []float32) float32 {
	b = b[:len(a)]
	var c0, c1, c2, c3 archsimd.Float32x8
	i := 0
	for ; i+32 <= len(a); i += 32 {
		c0 = archsimd.LoadFloat32x8Slice(a[i:]).MulAdd(archsimd.LoadFloat32x8Slice(b[i:]), c0)
		c1 = archsimd.LoadFloat32x8Slice(a[i+8:]).MulAdd(archsimd.LoadFloat32x8Slice(b[i+8:]), c1)
		c2 = archsimd.LoadFloat32x8Slice(a[i+16:]).MulAdd(archsimd.LoadFloat32x8Slice(b[i+16:]), c2)
		c3 = archsimd.LoadFloat32x8Slice(a[i+24:]).MulAdd(archsimd.LoadFloat32x8Slice(b[i+24:]), c3)
	}
	for ; i+8 <= len(a); i += 8 {
		c0 = archsimd.LoadFloat32x8Slice(a[i:]).MulAdd(archsimd.LoadFloat32x8Slice(b[i:]), c0)
	}
	if i < len(a) {
		c1 = loadPart(a[i:]).MulAdd(loadPart(b[i:]), c1)
	}
	r := hsum8(c0.Add(c1).Add(c2.Add(c3)))
	archsimd.ClearAVXUpperBits()
	return r
}

func sumSqSIMD(x []float32) float32 { return dotSIMD(x, x) }

func axpySIMD(alpha float32, x, y []float32) {
	y = y[:len(x)]
	av := archsimd.BroadcastFloat32x8(alpha)
	i := 0
	for ; i+8 <= len(x); i += 8 {
		av.MulAdd(archsimd.LoadFloat32x8Slice(x[i:]), archsimd.LoadFloat32x8Slice(y[i:])).StoreSlice(y[i:])
	}
	if i < len(x) {
		storePart(av.MulAdd(loadPart(x[i:]), loadPart(y[i:])), y[i:])
	}
	archsimd.ClearAVXUpperBits()
}

func scaleMulSIMD(out, x, w []float32, s float32) {
	x, w = x[:len(out)], w[:len(out)]
	sv := archsimd.BroadcastFloat32x8(s)
	i := 0
	for ; i+8 <= len(out); i += 8 {
		archsimd.LoadFloat32x8Slice(x[i:]).Mul(sv).Mul(archsimd.LoadFloat32x8Slice(w[i:])).StoreSlice(out[i:])
	}
	if i < len(out) {
		storePart(loadPart(x[i:]).Mul(sv).Mul(loadPart(w[i:])), out[i:])
	}
	archsimd.ClearAVXUpperBits()
}

func addSIMD(dst, src []float32) {
	src = src[:len(dst)]
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		archsimd.LoadFloat32x8Slice(dst[i:]).Add(archsimd.LoadFloat32x8Slice(src[i:])).StoreSlice(dst[i:])
	}
	if i < len(dst) {
		storePart(loadPart(dst[i:]).Add(loadPart(src[i:])), dst[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// ropeSIMD: (a,b) ← (a·cos − b·sin, b·cos + a·sin).
func ropeSIMD(a, b, cos, sin []float32) {
	b, cos, sin = b[:len(a)], cos[:len(a)], sin[:len(a)]
	i := 0
	for ; i+8 <= len(a); i += 8 {
		x0, x1 := archsimd.LoadFloat32x8Slice(a[i:]), archsimd.LoadFloat32x8Slice(b[i:])
		c, s := archsimd.LoadFloat32x8Slice(cos[i:]), archsimd.LoadFloat32x8Slice(sin[i:])
		x0.Mul(c).Sub(x1.Mul(s)).StoreSlice(a[i:])
		x1.Mul(c).Add(x0.Mul(s)).StoreSlice(b[i:])
	}
	if i < len(a) {
		ropeGo(a[i:], b[i:], cos[i:], sin[i:])
	}
	archsimd.ClearAVXUpperBits()
}

// exp8 is expf (see elementwise.go) on 8 lanes: inputs are clamped to
// [expMin, expMax] and lanes below expMin (including -Inf) give 0.
func exp8(x archsimd.Float32x8) archsimd.Float32x8 {
	under := x.GreaterEqual(archsimd.BroadcastFloat32x8(expMin))
	x = x.Max(archsimd.BroadcastFloat32x8(expMin)).Min(archsimd.BroadcastFloat32x8(expMax))
	n := x.Mul(archsimd.BroadcastFloat32x8(expLog2e)).RoundToEven()
	r := n.MulAdd(archsimd.BroadcastFloat32x8(-expLn2Hi), x)
	r = n.MulAdd(archsimd.BroadcastFloat32x8(-expLn2Lo), r)
	p := archsimd.BroadcastFloat32x8(expP0).MulAdd(r, archsimd.BroadcastFloat32x8(expP1))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x8(expP2))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x8(expP3))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x8(expP4))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x8(expP5))
	e := p.Mul(r).MulAdd(r, r).Add(archsimd.BroadcastFloat32x8(1))
	ni := n.ConvertToInt32() // exact: n is integral
	n1 := ni.ShiftAllRight(1)
	n2 := ni.Sub(n1)
	bias := archsimd.BroadcastInt32x8(127)
	s1 := n1.Add(bias).ShiftAllLeft(23).AsFloat32x8()
	s2 := n2.Add(bias).ShiftAllLeft(23).AsFloat32x8()
	return e.Mul(s1).Mul(s2).Masked(under)
}

func siluMulSIMD(out, gate, up []float32) {
	gate, up = gate[:len(out)], up[:len(out)]
	one := archsimd.BroadcastFloat32x8(1)
	zero := archsimd.BroadcastFloat32x8(0)
	i := 0
	for ; i+8 <= len(out); i += 8 {
		g := archsimd.LoadFloat32x8Slice(gate[i:])
		u := archsimd.LoadFloat32x8Slice(up[i:])
		g.Div(one.Add(exp8(zero.Sub(g)))).Mul(u).StoreSlice(out[i:])
	}
	if i < len(out) {
		g := loadPart(gate[i:])
		u := loadPart(up[i:])
		storePart(g.Div(one.Add(exp8(zero.Sub(g)))).Mul(u), out[i:])
	}
	archsimd.ClearAVXUpperBits()
}
