//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"unsafe"
)

// AVX2/FMA GEMM written with simd/archsimd. Like the plain-Go path it works
// in dot-product form: y[i,j] = <x row i, w row j>, both contiguous in k, so
// nothing is packed. The 2×4 microkernel keeps 8 Float32x8 partial sums and
// per 8 k-values loads 2 x vectors and 4 w vectors for 8 FMAs; the 8 lanes of
// each sum are reduced once at the end (per k block).
//
// Where the CPU has AVX-512F the same 2×4 tile runs on Float32x16 vectors
// (micro2x4z), about twice as fast per core. Bigger tiles lose: the Go
// register allocator uses only 16 vector registers and always picks the
// VFMADD213 form, which destroys a multiplicand, so 3×4 or 4×4 tiles
// spill (docs/DECISIONS.md, "GEMM tiles and blocking").
//
// Blocking: rows of x in blocks of simdMB, k in blocks of simdKB, so the
// x slab being swept stays in L2 and the 4 w rows of the current tile column
// in L1 (loop order: x row block, k block, 4 w rows, 2 x rows).

const simdKB = 1024

var (
	hasAVX2FMA = archsimd.X86.AVX2() && archsimd.X86.FMA()
	hasAVX512  = hasAVX2FMA && archsimd.X86.AVX512()

	// simdWide selects the AVX-512 microkernels. Set at init; tests flip
	// it (setSIMDVariant) to cover both kernels on an AVX-512 machine.
	simdWide = hasAVX512
)

// simdVariants lists the GEMM microkernel variants usable here (tests).
func simdVariants() []string {
	switch {
	case hasAVX512:
		return []string{"avx2", "avx512"}
	case hasAVX2FMA:
		return []string{"avx2"}
	}
	return nil
}

// setSIMDVariant selects a variant and returns a func restoring the old one.
func setSIMDVariant(v string) (restore func()) {
	old := simdWide
	simdWide = v == "avx512" && hasAVX512
	return func() { simdWide = old }
}

func simdAvailable() bool { return hasAVX2FMA }

func gemmSIMD(m, n, k int, x, w, y []float32, acc bool) {
	runGemm(m, n, k, x, w, y, acc, 2, 4, gemmSIMDRect)
}

// ld8 loads 8 floats at p+i (i in floats). Callers guarantee i+8 ≤ the
// length of the slice p points into (bounds are checked once per rectangle,
// in gemmSIMDRect, instead of per load).
func ld8(p unsafe.Pointer, i int) archsimd.Float32x8 {
	return archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p, uintptr(i)*4)))
}

// hsum4 returns [Σa0, Σa1, Σa2, Σa3] (sum over the 8 lanes of each).
func hsum4(a0, a1, a2, a3 archsimd.Float32x8) archsimd.Float32x4 {
	h := a0.AddPairsGrouped(a1).AddPairsGrouped(a2.AddPairsGrouped(a3))
	return h.GetLo().Add(h.GetHi())
}

func hsum1(a archsimd.Float32x8) float32 {
	h := a.GetLo().Add(a.GetHi())
	h = h.AddPairs(h)
	h = h.AddPairs(h)
	var out [4]float32
	h.Store(&out)
	return out[0]
}

// store4 writes (or, if acc, adds) v into y[0:4].
func store4v(y []float32, v archsimd.Float32x4, acc bool) {
	p := (*[4]float32)(y[:4])
	if acc {
		v = v.Add(archsimd.LoadFloat32x4(p))
	}
	v.Store(p)
}

// simdMB bounds the x rows swept per k block: simdMB × simdKB floats =
// 256 KiB stays in L2 while the 4 w rows of a tile column (16 KiB) stay in
// L1. Larger k blocks and x-row blocks than these measure the same; a k
// block of 256 is slower (more partial-sum reductions and y round trips):
// docs/DECISIONS.md, "GEMM tiles and blocking".
const simdMB = 64

// gemmSIMDRect computes y[i0:i1, j0:j1] (row stride n) over the full k.
func gemmSIMDRect(i0, i1, j0, j1, n, k int, x, w, y []float32, acc bool) {
	for ib := i0; ib < i1; ib += simdMB {
		gemmSIMDBlock(ib, min(i1, ib+simdMB), j0, j1, n, k, x, w, y, acc)
	}
	// Leave the upper vector halves clean for the SSE-encoded scalar float
	// code the Go compiler emits (avoids false dependencies on Intel).
	archsimd.ClearAVXUpperBits()
}

func gemmSIMDBlock(i0, i1, j0, j1, n, k int, x, w, y []float32, acc bool) {
	// Bounds for the unsafe loads below: every x row i < i1 and w row j < j1
	// is read only within [row*k, row*k+k).
	_ = x[i1*k-1]
	_ = w[j1*k-1]
	_ = y[(i1-1)*n+j1-1]
	xp := unsafe.Pointer(&x[0])
	wp := unsafe.Pointer(&w[0])
	for k0 := 0; k0 < k; k0 += simdKB {
		k1 := min(k, k0+simdKB)
		k8 := k0 + (k1-k0)&^7 // end of the whole 8-float chunks
		k16 := k0 + (k1-k0)&^15
		accum := acc || k0 > 0
		j := j0
		for ; j+4 <= j1; j += 4 {
			i := i0
			if simdWide {
				for ; i+2 <= i1; i += 2 {
					micro2x4z(xp, wp, i, j, k, k0, k16, k1, y, n, accum)
				}
				if i < i1 {
					micro1x4z(xp, wp, i, j, k, k0, k16, k1, y, n, accum)
				}
				continue
			}
			for ; i+2 <= i1; i += 2 {
				micro2x4(xp, wp, i, j, k, k0, k8, k1, y, n, accum)
			}
			if i < i1 {
				micro1x4(xp, wp, i, j, k, k0, k8, k1, y, n, accum)
			}
		}
		for ; j < j1; j++ {
			for i := i0; i < i1; i++ {
				s := dotSIMDRange(xp, wp, i*k, j*k, k0, k8, k1)
				if accum {
					s += y[i*n+j]
				}
				y[i*n+j] = s
			}
		}
	}
}

// tailLoad returns the 8-float vector of row (base) at [k8, k1) zero-padded;
// k1-k8 < 8.
func tailLoad(p unsafe.Pointer, base, k8, k1 int) archsimd.Float32x8 {
	s := unsafe.Slice((*float32)(unsafe.Add(p, uintptr(base+k8)*4)), k1-k8)
	return loadPart(s)
}

// micro2x4: y[i+r, j+c] (+)= Σ_{p∈[k0,k1)} x[i+r, p]·w[j+c, p], r<2, c<4.
// 8 accumulators + 2 x vectors + 1 w vector fit the 16 registers that the Go
// register allocator uses; bigger tiles (3×4, 2×6, 4×4 with Float32x16) spill
// and are slower.
func micro2x4(xp, wp unsafe.Pointer, i, j, k, k0, k8, k1 int, y []float32, n int, acc bool) {
	x0, x1 := i*k, (i+1)*k
	w0, w1, w2, w3 := j*k, (j+1)*k, (j+2)*k, (j+3)*k
	var c00, c01, c02, c03, c10, c11, c12, c13 archsimd.Float32x8
	for p := k0; p < k8; p += 8 {
		a0, a1 := ld8(xp, x0+p), ld8(xp, x1+p)
		b := ld8(wp, w0+p)
		c00, c10 = b.MulAdd(a0, c00), b.MulAdd(a1, c10)
		b = ld8(wp, w1+p)
		c01, c11 = b.MulAdd(a0, c01), b.MulAdd(a1, c11)
		b = ld8(wp, w2+p)
		c02, c12 = b.MulAdd(a0, c02), b.MulAdd(a1, c12)
		b = ld8(wp, w3+p)
		c03, c13 = b.MulAdd(a0, c03), b.MulAdd(a1, c13)
	}
	if k8 < k1 {
		a0, a1 := tailLoad(xp, x0, k8, k1), tailLoad(xp, x1, k8, k1)
		b := tailLoad(wp, w0, k8, k1)
		c00, c10 = b.MulAdd(a0, c00), b.MulAdd(a1, c10)
		b = tailLoad(wp, w1, k8, k1)
		c01, c11 = b.MulAdd(a0, c01), b.MulAdd(a1, c11)
		b = tailLoad(wp, w2, k8, k1)
		c02, c12 = b.MulAdd(a0, c02), b.MulAdd(a1, c12)
		b = tailLoad(wp, w3, k8, k1)
		c03, c13 = b.MulAdd(a0, c03), b.MulAdd(a1, c13)
	}
	store4v(y[i*n+j:], hsum4(c00, c01, c02, c03), acc)
	store4v(y[(i+1)*n+j:], hsum4(c10, c11, c12, c13), acc)
}

func micro1x4(xp, wp unsafe.Pointer, i, j, k, k0, k8, k1 int, y []float32, n int, acc bool) {
	x0 := i * k
	w0, w1, w2, w3 := j*k, (j+1)*k, (j+2)*k, (j+3)*k
	var c0, c1, c2, c3 archsimd.Float32x8
	for p := k0; p < k8; p += 8 {
		a := ld8(xp, x0+p)
		c0 = a.MulAdd(ld8(wp, w0+p), c0)
		c1 = a.MulAdd(ld8(wp, w1+p), c1)
		c2 = a.MulAdd(ld8(wp, w2+p), c2)
		c3 = a.MulAdd(ld8(wp, w3+p), c3)
	}
	if k8 < k1 {
		a := tailLoad(xp, x0, k8, k1)
		c0 = a.MulAdd(tailLoad(wp, w0, k8, k1), c0)
		c1 = a.MulAdd(tailLoad(wp, w1, k8, k1), c1)
		c2 = a.MulAdd(tailLoad(wp, w2, k8, k1), c2)
		c3 = a.MulAdd(tailLoad(wp, w3, k8, k1), c3)
	}
	store4v(y[i*n+j:], hsum4(c0, c1, c2, c3), acc)
}

// dotSIMDRange returns Σ_{p∈[k0,k1)} x[xb+p]·w[wb+p].
func dotSIMDRange(xp, wp unsafe.Pointer, xb, wb, k0, k8, k1 int) float32 {
	var c0, c1 archsimd.Float32x8
	p := k0
	for ; p+16 <= k8; p += 16 {
		c0 = ld8(xp, xb+p).MulAdd(ld8(wp, wb+p), c0)
		c1 = ld8(xp, xb+p+8).MulAdd(ld8(wp, wb+p+8), c1)
	}
	for ; p < k8; p += 8 {
		c0 = ld8(xp, xb+p).MulAdd(ld8(wp, wb+p), c0)
	}
	if k8 < k1 {
		c1 = tailLoad(xp, xb, k8, k1).MulAdd(tailLoad(wp, wb, k8, k1), c1)
	}
	return hsum1(c0.Add(c1))
}

// ld16 is ld8 for 16 floats (callers guarantee i+16 ≤ the slice length).
func ld16(p unsafe.Pointer, i int) archsimd.Float32x16 {
	return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p, uintptr(i)*4)))
}

// tailLoad16 returns row base's floats [k16, k1) zero-padded to 16
// (k1-k16 < 16), through a stack buffer (see loadPart for why not
// LoadFloat32x16SlicePart).
func tailLoad16(p unsafe.Pointer, base, k16, k1 int) archsimd.Float32x16 {
	var b [16]float32
	copy(b[:], unsafe.Slice((*float32)(unsafe.Add(p, uintptr(base+k16)*4)), k1-k16))
	return archsimd.LoadFloat32x16(&b)
}

// fold16 adds the halves of a Float32x16 so the AVX2 reductions apply.
func fold16(a archsimd.Float32x16) archsimd.Float32x8 { return a.GetLo().Add(a.GetHi()) }

// micro2x4z is micro2x4 on 16-lane vectors (AVX-512F).
func micro2x4z(xp, wp unsafe.Pointer, i, j, k, k0, k16, k1 int, y []float32, n int, acc bool) {
	x0, x1 := i*k, (i+1)*k
	w0, w1, w2, w3 := j*k, (j+1)*k, (j+2)*k, (j+3)*k
	var c00, c01, c02, c03, c10, c11, c12, c13 archsimd.Float32x16
	for p := k0; p < k16; p += 16 {
		a0, a1 := ld16(xp, x0+p), ld16(xp, x1+p)
		b := ld16(wp, w0+p)
		c00, c10 = b.MulAdd(a0, c00), b.MulAdd(a1, c10)
		b = ld16(wp, w1+p)
		c01, c11 = b.MulAdd(a0, c01), b.MulAdd(a1, c11)
		b = ld16(wp, w2+p)
		c02, c12 = b.MulAdd(a0, c02), b.MulAdd(a1, c12)
		b = ld16(wp, w3+p)
		c03, c13 = b.MulAdd(a0, c03), b.MulAdd(a1, c13)
	}
	if k16 < k1 {
		a0, a1 := tailLoad16(xp, x0, k16, k1), tailLoad16(xp, x1, k16, k1)
		b := tailLoad16(wp, w0, k16, k1)
		c00, c10 = b.MulAdd(a0, c00), b.MulAdd(a1, c10)
		b = tailLoad16(wp, w1, k16, k1)
		c01, c11 = b.MulAdd(a0, c01), b.MulAdd(a1, c11)
		b = tailLoad16(wp, w2, k16, k1)
		c02, c12 = b.MulAdd(a0, c02), b.MulAdd(a1, c12)
		b = tailLoad16(wp, w3, k16, k1)
		c03, c13 = b.MulAdd(a0, c03), b.MulAdd(a1, c13)
	}
	store4v(y[i*n+j:], hsum4(fold16(c00), fold16(c01), fold16(c02), fold16(c03)), acc)
	store4v(y[(i+1)*n+j:], hsum4(fold16(c10), fold16(c11), fold16(c12), fold16(c13)), acc)
}

// micro1x4z is micro1x4 on 16-lane vectors (AVX-512F).
func micro1x4z(xp, wp unsafe.Pointer, i, j, k, k0, k16, k1 int, y []float32, n int, acc bool) {
	x0 := i * k
	w0, w1, w2, w3 := j*k, (j+1)*k, (j+2)*k, (j+3)*k
	var c0, c1, c2, c3 archsimd.Float32x16
	for p := k0; p < k16; p += 16 {
		a := ld16(xp, x0+p)
		c0 = a.MulAdd(ld16(wp, w0+p), c0)
		c1 = a.MulAdd(ld16(wp, w1+p), c1)
		c2 = a.MulAdd(ld16(wp, w2+p), c2)
		c3 = a.MulAdd(ld16(wp, w3+p), c3)
	}
	if k16 < k1 {
		a := tailLoad16(xp, x0, k16, k1)
		c0 = a.MulAdd(tailLoad16(wp, w0, k16, k1), c0)
		c1 = a.MulAdd(tailLoad16(wp, w1, k16, k1), c1)
		c2 = a.MulAdd(tailLoad16(wp, w2, k16, k1), c2)
		c3 = a.MulAdd(tailLoad16(wp, w3, k16, k1), c3)
	}
	store4v(y[i*n+j:], hsum4(fold16(c0), fold16(c1), fold16(c2), fold16(c3)), acc)
}
