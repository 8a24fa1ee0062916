package cpu

import "unsafe"

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
