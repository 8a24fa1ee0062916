package cpu

import (
	"fmt"
	"math"
	"unsafe"
)

// bf16 GEMM for small M (decode). Batch-1 decode is memory-bound: every
// token streams every weight matrix once, and a bf16 copy of the weights is
// half the bytes of the float32 one. bf16 → float32 is exact (the bf16 bit
// pattern is the top half of the float32's), so GemmBF16 computes the same
// products as Gemm on the widened weights; only the summation order (and so
// the last bits of the result) can differ.
//
// The kernels are dot-product form like the float32 ones: y[i,j] =
// <x row i, w row j>, both contiguous in k. Work is split over the worker
// pool by weight rows (columns of y), so each weight byte crosses the
// memory bus once per call; tiny products run inline.

// bf16Kernel computes y[i0:i1, j0:j1] (row stride n) = x·wᵀ (+ y if acc)
// over all of k. x is [m,k] float32, w is [n,k] bf16 bits.
type bf16Kernel func(i0, i1, j0, j1, n, k int, x []float32, w []uint16, y []float32, acc bool)

// bf16Impl is a kernel and whether it wants x deinterleaved by permuteX
// (then its x argument is [m, roundUp(k,32)], see permuteX).
type bf16Impl struct {
	kern    bf16Kernel
	permute bool
}

// HasFastBF16 reports whether GemmBF16 runs a vectorised kernel here: on
// amd64 with AVX2 and FMA the assembly kernels (bf16_amd64.s); never after
// SetGEMMPath("go") forces plain Go everywhere. It does not depend on the
// float32 GEMM: the "openblas" and "asm" paths both have the assembly
// kernels (a machine without OpenBLAS runs "asm"). When false, GemmBF16
// still works (plain Go) but is slower than Gemm on float32 weights, so
// callers should prefer Gemm.
func HasFastBF16() bool {
	return bf16AsmAvailable() && !goForced
}

func checkGemmBF16(m, n, k int, x []float32, w []uint16, y []float32) {
	if m < 0 || n < 0 || k < 0 || len(x) < m*k || len(w) < n*k || len(y) < m*n {
		panic(fmt.Sprintf("cpu.GemmBF16: bad shapes m=%d n=%d k=%d len(x)=%d len(w)=%d len(y)=%d",
			m, n, k, len(x), len(w), len(y)))
	}
}

// GemmBF16 computes y[m,n] = x[m,k] · w[n,k]ᵀ, overwriting y, where w holds
// bf16 bit patterns (the top 16 bits of a float32) in the Hugging Face
// [out,in] layout. Meant for small m (about 1-8 rows); for large m Gemm on
// float32 weights is faster (this kernel re-widens each weight for every
// pair of x rows). y must not overlap x; only the first m·k, n·k and m·n
// elements are used. Safe for concurrent use, like Gemm.
func GemmBF16(m, n, k int, x []float32, w []uint16, y []float32) {
	checkGemmBF16(m, n, k, x, w, y)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		clear(y[:m*n])
		return
	}
	runGemmBF16(m, n, k, x, w, y, false, chooseBF16())
}

// GemmBF16Acc computes y[m,n] += x[m,k] · w[n,k]ᵀ (see GemmBF16).
func GemmBF16Acc(m, n, k int, x []float32, w []uint16, y []float32) {
	checkGemmBF16(m, n, k, x, w, y)
	if m == 0 || n == 0 || k == 0 {
		return
	}
	runGemmBF16(m, n, k, x, w, y, true, chooseBF16())
}

// chooseBF16 picks the bf16 kernel: assembly, else plain Go (see
// HasFastBF16).
func chooseBF16() bf16Impl {
	if !HasFastBF16() {
		return bf16Impl{gemmBF16GoRect, false}
	}
	return bf16AsmImpl()
}

// BF16Bits returns the bf16 bit pattern nearest to f (round to nearest,
// ties to even; NaN stays NaN).
func BF16Bits(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and non-zero
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// BF16ToFloat32 widens a bf16 bit pattern (exact).
func BF16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// gemmBF16Ref is the obviously-correct reference (float64 accumulation).
func gemmBF16Ref(m, n, k int, x []float32, w []uint16, y []float32, acc bool) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				s += float64(x[i*k+p]) * float64(BF16ToFloat32(w[j*k+p]))
			}
			if acc {
				s += float64(y[i*n+j])
			}
			y[i*n+j] = float32(s)
		}
	}
}

// gemmBF16GoRect is the plain-Go kernel: one x row against 4 weight rows
// at a time (4 independent sums, each weight widened once per x row).
func gemmBF16GoRect(i0, i1, j0, j1, n, k int, x []float32, w []uint16, y []float32, acc bool) {
	for i := i0; i < i1; i++ {
		xr := x[i*k : i*k+k]
		yr := y[i*n : i*n+n]
		j := j0
		for ; j+4 <= j1; j += 4 {
			w0, w1 := w[j*k:j*k+k], w[(j+1)*k:(j+1)*k+k]
			w2, w3 := w[(j+2)*k:(j+2)*k+k], w[(j+3)*k:(j+3)*k+k]
			var s0, s1, s2, s3 float32
			for p, a := range xr {
				s0 += a * BF16ToFloat32(w0[p])
				s1 += a * BF16ToFloat32(w1[p])
				s2 += a * BF16ToFloat32(w2[p])
				s3 += a * BF16ToFloat32(w3[p])
			}
			if acc {
				s0, s1, s2, s3 = s0+yr[j], s1+yr[j+1], s2+yr[j+2], s3+yr[j+3]
			}
			yr[j], yr[j+1], yr[j+2], yr[j+3] = s0, s1, s2, s3
		}
		for ; j < j1; j++ {
			wr := w[j*k : j*k+k]
			var s float32
			for p, a := range xr {
				s += a * BF16ToFloat32(wr[p])
			}
			if acc {
				s += yr[j]
			}
			yr[j] = s
		}
	}
}

// bf16Job is one parallel bf16 GEMM; the single instance theBF16Job is
// guarded by poolMu (see pool.go). Parts split the weight rows [0,n) on
// multiples of 4 (the microkernel width).
type bf16Job struct {
	m, n, k int
	x       []float32 // [m,k]
	w       []uint16  // [n,k]
	y       []float32 // [m,n]
	acc     bool
	kern    bf16Kernel
}

var theBF16Job bf16Job

func (g *bf16Job) run(p, np int) {
	j0, j1 := split(g.n, np, p, 4)
	if j0 < j1 {
		g.kern(0, g.m, j0, j1, g.n, g.k, g.x, g.w, g.y, g.acc)
	}
}

// bf16SplitBytes is the least weight bytes a bf16 or int8 GEMM must read
// to be split over the pool: below it the hand-off to a spinning worker
// (pool.go) costs as much as the second core saves. Figures:
// docs/DECISIONS.md, "GEMM split thresholds".
const bf16SplitBytes = 192 << 10

// splitFlops is the least work (flops) that makes a bf16 or int8 GEMM
// split over the pool whatever its weight bytes: from a few dozen rows on
// (prefill chunks, big decode batches) a GEMM computes for ≥ 50 µs, well
// above a hand-off.
const splitFlops = 1 << 22

// splitLowP reports whether a bf16 or int8 GEMM of m×n×k reading wbytes of
// weights is split over the pool (see bf16SplitBytes and splitFlops).
func splitLowP(m, n, k, wbytes int) bool {
	flops := 2 * m * n * k
	return flops >= 1<<16 && (wbytes >= bf16SplitBytes || flops >= splitFlops)
}

// bf16X is the permuted copy of x for kernels that want one: [m,
// roundUp(k,32)], grown on demand, guarded by poolMu.
var bf16X []float32

// runGemmBF16 runs im over the whole product, split by weight rows over
// the pool when the product is big enough to pay for the hand-off
// (splitLowP) and each part gets ≥ 16 rows. The whole call
// holds poolMu, also when it runs inline, because of bf16X.
func runGemmBF16(m, n, k int, x []float32, w []uint16, y []float32, acc bool, im bf16Impl) {
	poolMu.Lock()
	defer poolMu.Unlock()
	runGemmBF16Locked(m, n, k, x, w, y, acc, im)
}

// runGemmBF16Locked is runGemmBF16 with poolMu already held.
func runGemmBF16Locked(m, n, k int, x []float32, w []uint16, y []float32, acc bool, im bf16Impl) {
	if im.permute {
		kp := (k + 31) &^ 31
		if cap(bf16X) < m*kp {
			bf16X = make([]float32, m*kp)
		}
		permuteX(m, k, x, bf16X[:m*kp])
		x = bf16X[:m*kp]
	}
	parts := min(Threads(), max(1, n/16))
	if !splitLowP(m, n, k, 2*n*k) {
		parts = 1
	}
	if parts <= 1 {
		im.kern(0, m, 0, n, n, k, x, w, y, acc)
		return
	}
	theBF16Job = bf16Job{m, n, k, x, w, y, acc, im.kern}
	runPartsChunked(&theBF16Job, parts, gemmChunks(m))
	theBF16Job = bf16Job{} // do not keep the caller's buffers alive
}

// permuteX writes x [m,k] into xs [m,kp] (kp = roundUp(k,32)) with each
// 32-float chunk deinterleaved: xs[c+l] = x[c+2l], xs[c+16+l] = x[c+2l+1]
// for l < 16, zero beyond k.
//
// The whole chunks go to permuteAVX2 where permuteAsm is set (amd64 with
// AVX2: as a scalar loop it showed in the server's CPU profile, run
// serially before each GEMM is split); the rest is the scalar loop.
func permuteX(m, k int, x, xs []float32) {
	kp := (k + 31) &^ 31
	k32 := k &^ 31
	for i := 0; i < m; i++ {
		src, dst := x[i*k:i*k+k], xs[i*kp:i*kp+kp]
		clear(dst[k32:])
		p0 := 0
		if permuteAsm && k32 > 0 {
			permuteAVX2(&dst[0], &src[0], k32/32)
			p0 = k32
		}
		for p := p0; p < k; p++ {
			c, r := p&^31, p&31
			dst[c+(r&1)*16+r>>1] = src[p]
		}
	}
}

// bf16-dot GEMM: x rounded to bf16 as well, so that both operands are bf16
// and the AVX512_BF16 instruction VDPBF16PS does 32 multiply-adds per
// instruction on the bf16 bits as stored, with no widening of the weights
// (the GemmBF16 kernels spend two integer ops per 32 weights on that, and
// FMA only 16 lanes). It changes the numerics: x moves by up to half a
// bf16 step (2⁻⁹ relative), as under the bf16 autocast the model was
// trained with. The products of two bf16 are exact in float32, so the
// result is GemmBF16 on the rounded x up to float32 summation order.

// HasBF16Dot reports whether GemmBF16Dot runs the VDPBF16PS kernels
// (amd64 with AVX-512F and AVX512_BF16, and not after SetGEMMPath("go")).
// When false GemmBF16Dot still works, with the same numerics up to
// summation order: it rounds x and runs GemmBF16's kernel, a little
// slower than GemmBF16 itself.
func HasBF16Dot() bool { return useBF16Dot && !goForced }

// GemmBF16Dot computes y[m,n] = bf16(x)[m,k] · w[n,k]ᵀ, overwriting y,
// where bf16(x) is x rounded to bf16 (BF16Bits, round to nearest even) and
// w holds bf16 bit patterns in the [out,in] layout, as for GemmBF16. The
// result equals GemmBF16 on the rounded x up to float32 summation order,
// except that on the VDPBF16PS path (HasBF16Dot) subnormal values of
// bf16(x), of w and of the partial sums are taken as zero. y must not
// overlap x; only the first m·k, n·k and m·n elements are used. Safe for
// concurrent use, like Gemm.
func GemmBF16Dot(m, n, k int, x []float32, w []uint16, y []float32) {
	checkGemmBF16(m, n, k, x, w, y)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		clear(y[:m*n])
		return
	}
	runGemmBF16Dot(m, n, k, x, w, y, false)
}

// GemmBF16DotAcc computes y[m,n] += bf16(x)[m,k] · w[n,k]ᵀ (see
// GemmBF16Dot).
func GemmBF16DotAcc(m, n, k int, x []float32, w []uint16, y []float32) {
	checkGemmBF16(m, n, k, x, w, y)
	if m == 0 || n == 0 || k == 0 {
		return
	}
	runGemmBF16Dot(m, n, k, x, w, y, true)
}

// Scratch of the rounded x, grown on demand, guarded by poolMu:
// bf16DotX holds bf16 bits [m, roundUp(k,32)] for the VDPBF16PS kernels,
// zero-padded; bf16DotXf the rounded values [m,k] as float32 for the
// fallback.
var (
	bf16DotX  []uint16
	bf16DotXf []float32
)

// runGemmBF16Dot rounds x into scratch and runs the product as
// runGemmBF16 does (same pool split), on the VDPBF16PS kernel where
// HasBF16Dot, else on chooseBF16's kernel with the rounded x as float32.
func runGemmBF16Dot(m, n, k int, x []float32, w []uint16, y []float32, acc bool) {
	poolMu.Lock()
	defer poolMu.Unlock()
	if !HasBF16Dot() {
		if cap(bf16DotXf) < m*k {
			bf16DotXf = make([]float32, m*k)
		}
		xf := bf16DotXf[:m*k]
		for i, v := range x[:m*k] {
			xf[i] = BF16ToFloat32(BF16Bits(v))
		}
		runGemmBF16Locked(m, n, k, xf, w, y, acc, chooseBF16())
		return
	}
	kp := (k + 31) &^ 31
	if cap(bf16DotX) < m*kp {
		bf16DotX = make([]uint16, m*kp)
	}
	xs := bf16DotX[:m*kp]
	roundX(m, k, x, xs)
	// The kernel type takes x as []float32: pass the bits through unsafe
	// (kp is even, so the view covers all of xs); bf16DotRect views them
	// as uint16 again.
	xv := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(xs))), len(xs)/2)
	runGemmBF16Locked(m, n, k, xv, w, y, acc, bf16Impl{bf16DotRect, false})
}

// roundX writes the bf16 bits of x [m,k] into xs [m,kp] (kp =
// roundUp(k,32)), zero beyond k in each row: whole 32-float chunks with
// roundBF16 (VCVTNEPS2BF16 where available, which also flushes subnormals
// to zero, as VDPBF16PS does with them anyway), the rest with BF16Bits.
func roundX(m, k int, x []float32, xs []uint16) {
	kp := (k + 31) &^ 31
	k32 := k &^ 31
	for i := 0; i < m; i++ {
		src, dst := x[i*k:i*k+k], xs[i*kp:i*kp+kp]
		p0 := 0
		if roundBF16Asm && k32 > 0 {
			roundBF16AVX512(&dst[0], &src[0], k32/32)
			p0 = k32
		}
		for p := p0; p < k; p++ {
			dst[p] = BF16Bits(src[p])
		}
		clear(dst[k:])
	}
}

// dotBF16 returns Σ x[p]·w[p] over bf16 bits (products exact in float32).
func dotBF16(x, w []uint16) float32 {
	var s float32
	for p, b := range w {
		s += BF16ToFloat32(x[p]) * BF16ToFloat32(b)
	}
	return s
}
