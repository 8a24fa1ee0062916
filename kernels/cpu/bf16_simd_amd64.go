//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"unsafe"
)

// SIMD bf16 GEMM kernels (archsimd). A bf16 weight becomes a float32 by
// zero-extending it to 32 bits and shifting left 16 (VPMOVZXWD + VPSLLD),
// then it feeds an FMA exactly as in the float32 microkernels
// (gemm_simd_amd64.go): 2×4 and 1×4 dot-product tiles, 16-lane vectors where
// the CPU has AVX-512 (hasAVX512, which includes AVX512BW for the word
// extension), else 8-lane AVX2. The 4 weight rows of a tile (4·k·2 bytes,
// ≤ 8 KiB for the model's k ≤ 1024) stay in L1 while the x row pairs sweep
// them, so for M ≤ 8 each weight byte comes from memory once per call.

func bf16SIMDAvailable() bool { return hasAVX2FMA }

// ldw16 loads 16 bf16 values at p+i (i in elements) widened to float32.
// Callers guarantee i+16 ≤ the length of the slice p points into.
func ldw16(p unsafe.Pointer, i int) archsimd.Float32x16 {
	u := archsimd.LoadUint16x16((*[16]uint16)(unsafe.Add(p, uintptr(i)*2)))
	return u.ExtendToUint32().ShiftAllLeft(16).AsFloat32x16()
}

// ldw8 loads 8 bf16 values at p+i widened to float32 (AVX2).
func ldw8(p unsafe.Pointer, i int) archsimd.Float32x8 {
	u := archsimd.LoadUint16x8((*[8]uint16)(unsafe.Add(p, uintptr(i)*2)))
	return u.ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

// tailW16 widens row base's bf16 values [k16, k1) zero-padded to 16
// (k1-k16 < 16; zero bits are +0.0, so the padding adds nothing).
func tailW16(p unsafe.Pointer, base, k16, k1 int) archsimd.Float32x16 {
	var b [16]uint16
	copy(b[:], unsafe.Slice((*uint16)(unsafe.Add(p, uintptr(base+k16)*2)), k1-k16))
	return archsimd.LoadUint16x16(&b).ExtendToUint32().ShiftAllLeft(16).AsFloat32x16()
}

// tailW8 is tailW16 for 8 lanes (k1-k8 < 8).
func tailW8(p unsafe.Pointer, base, k8, k1 int) archsimd.Float32x8 {
	var b [8]uint16
	copy(b[:], unsafe.Slice((*uint16)(unsafe.Add(p, uintptr(base+k8)*2)), k1-k8))
	return archsimd.LoadUint16x8(&b).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

// gemmBF16SIMDRect computes y[i0:i1, j0:j1] (row stride n) over all of k.
func gemmBF16SIMDRect(i0, i1, j0, j1, n, k int, x []float32, w []uint16, y []float32, acc bool) {
	// Bounds for the unsafe loads below: x row i < i1 and w row j < j1
	// are read only within [row*k, row*k+k).
	_ = x[i1*k-1]
	_ = w[j1*k-1]
	_ = y[(i1-1)*n+j1-1]
	xp := unsafe.Pointer(&x[0])
	wp := unsafe.Pointer(&w[0])
	k8 := k &^ 7
	k16 := k &^ 15
	j := j0
	for ; j+4 <= j1; j += 4 {
		i := i0
		if simdWide {
			for ; i+2 <= i1; i += 2 {
				bf16Micro2x4z(xp, wp, i, j, k, k16, y, n, acc)
			}
			if i < i1 {
				bf16Micro1x4z(xp, wp, i, j, k, k16, y, n, acc)
			}
			continue
		}
		for ; i+2 <= i1; i += 2 {
			bf16Micro2x4(xp, wp, i, j, k, k8, y, n, acc)
		}
		if i < i1 {
			bf16Micro1x4(xp, wp, i, j, k, k8, y, n, acc)
		}
	}
	for ; j < j1; j++ {
		for i := i0; i < i1; i++ {
			s := bf16Dot(xp, wp, i*k, j*k, k8, k)
			if acc {
				s += y[i*n+j]
			}
			y[i*n+j] = s
		}
	}
	archsimd.ClearAVXUpperBits()
}

// bf16Micro2x4z: y[i+r, j+c] (+)= Σ_p x[i+r, p]·w[j+c, p], r<2, c<4, on
// 16-lane vectors (8 accumulators, as in micro2x4z).
func bf16Micro2x4z(xp, wp unsafe.Pointer, i, j, k, k16 int, y []float32, n int, acc bool) {
	x0, x1 := i*k, (i+1)*k
	w0, w1, w2, w3 := j*k, (j+1)*k, (j+2)*k, (j+3)*k
	var c00, c01, c02, c03, c10, c11, c12, c13 archsimd.Float32x16
	for p := 0; p < k16; p += 16 {
		a0, a1 := ld16(xp, x0+p), ld16(xp, x1+p)
		b := ldw16(wp, w0+p)
		c00, c10 = b.MulAdd(a0, c00), b.MulAdd(a1, c10)
		b = ldw16(wp, w1+p)
		c01, c11 = b.MulAdd(a0, c01), b.MulAdd(a1, c11)
		b = ldw16(wp, w2+p)
		c02, c12 = b.MulAdd(a0, c02), b.MulAdd(a1, c12)
		b = ldw16(wp, w3+p)
		c03, c13 = b.MulAdd(a0, c03), b.MulAdd(a1, c13)
	}
	if k16 < k {
		a0, a1 := tailLoad16(xp, x0, k16, k), tailLoad16(xp, x1, k16, k)
		b := tailW16(wp, w0, k16, k)
		c00, c10 = b.MulAdd(a0, c00), b.MulAdd(a1, c10)
		b = tailW16(wp, w1, k16, k)
		c01, c11 = b.MulAdd(a0, c01), b.MulAdd(a1, c11)
		b = tailW16(wp, w2, k16, k)
		c02, c12 = b.MulAdd(a0, c02), b.MulAdd(a1, c12)
		b = tailW16(wp, w3, k16, k)
		c03, c13 = b.MulAdd(a0, c03), b.MulAdd(a1, c13)
	}
	store4v(y[i*n+j:], hsum4(fold16(c00), fold16(c01), fold16(c02), fold16(c03)), acc)
	store4v(y[(i+1)*n+j:], hsum4(fold16(c10), fold16(c11), fold16(c12), fold16(c13)), acc)
}

// bf16Micro1x4z is bf16Micro2x4z for one x row.
func bf16Micro1x4z(xp, wp unsafe.Pointer, i, j, k, k16 int, y []float32, n int, acc bool) {
	x0 := i * k
	w0, w1, w2, w3 := j*k, (j+1)*k, (j+2)*k, (j+3)*k
	var c0, c1, c2, c3 archsimd.Float32x16
	for p := 0; p < k16; p += 16 {
		a := ld16(xp, x0+p)
		c0 = ldw16(wp, w0+p).MulAdd(a, c0)
		c1 = ldw16(wp, w1+p).MulAdd(a, c1)
		c2 = ldw16(wp, w2+p).MulAdd(a, c2)
		c3 = ldw16(wp, w3+p).MulAdd(a, c3)
	}
	if k16 < k {
		a := tailLoad16(xp, x0, k16, k)
		c0 = tailW16(wp, w0, k16, k).MulAdd(a, c0)
		c1 = tailW16(wp, w1, k16, k).MulAdd(a, c1)
		c2 = tailW16(wp, w2, k16, k).MulAdd(a, c2)
		c3 = tailW16(wp, w3, k16, k).MulAdd(a, c3)
	}
	store4v(y[i*n+j:], hsum4(fold16(c0), fold16(c1), fold16(c2), fold16(c3)), acc)
}

// bf16Micro2x4 is bf16Micro2x4z on 8-lane AVX2 vectors.
func bf16Micro2x4(xp, wp unsafe.Pointer, i, j, k, k8 int, y []float32, n int, acc bool) {
	x0, x1 := i*k, (i+1)*k
	w0, w1, w2, w3 := j*k, (j+1)*k, (j+2)*k, (j+3)*k
	var c00, c01, c02, c03, c10, c11, c12, c13 archsimd.Float32x8
	for p := 0; p < k8; p += 8 {
		a0, a1 := ld8(xp, x0+p), ld8(xp, x1+p)
		b := ldw8(wp, w0+p)
		c00, c10 = b.MulAdd(a0, c00), b.MulAdd(a1, c10)
		b = ldw8(wp, w1+p)
		c01, c11 = b.MulAdd(a0, c01), b.MulAdd(a1, c11)
		b = ldw8(wp, w2+p)
		c02, c12 = b.MulAdd(a0, c02), b.MulAdd(a1, c12)
		b = ldw8(wp, w3+p)
		c03, c13 = b.MulAdd(a0, c03), b.MulAdd(a1, c13)
	}
	if k8 < k {
		a0, a1 := tailLoad(xp, x0, k8, k), tailLoad(xp, x1, k8, k)
		b := tailW8(wp, w0, k8, k)
		c00, c10 = b.MulAdd(a0, c00), b.MulAdd(a1, c10)
		b = tailW8(wp, w1, k8, k)
		c01, c11 = b.MulAdd(a0, c01), b.MulAdd(a1, c11)
		b = tailW8(wp, w2, k8, k)
		c02, c12 = b.MulAdd(a0, c02), b.MulAdd(a1, c12)
		b = tailW8(wp, w3, k8, k)
		c03, c13 = b.MulAdd(a0, c03), b.MulAdd(a1, c13)
	}
	store4v(y[i*n+j:], hsum4(c00, c01, c02, c03), acc)
	store4v(y[(i+1)*n+j:], hsum4(c10, c11, c12, c13), acc)
}

// bf16Micro1x4 is bf16Micro2x4 for one x row.
func bf16Micro1x4(xp, wp unsafe.Pointer, i, j, k, k8 int, y []float32, n int, acc bool) {
	x0 := i * k
	w0, w1, w2, w3 := j*k, (j+1)*k, (j+2)*k, (j+3)*k
	var c0, c1, c2, c3 archsimd.Float32x8
	for p := 0; p < k8; p += 8 {
		a := ld8(xp, x0+p)
		c0 = ldw8(wp, w0+p).MulAdd(a, c0)
		c1 = ldw8(wp, w1+p).MulAdd(a, c1)
		c2 = ldw8(wp, w2+p).MulAdd(a, c2)
		c3 = ldw8(wp, w3+p).MulAdd(a, c3)
	}
	if k8 < k {
		a := tailLoad(xp, x0, k8, k)
		c0 = tailW8(wp, w0, k8, k).MulAdd(a, c0)
		c1 = tailW8(wp, w1, k8, k).MulAdd(a, c1)
		c2 = tailW8(wp, w2, k8, k).MulAdd(a, c2)
		c3 = tailW8(wp, w3, k8, k).MulAdd(a, c3)
	}
	store4v(y[i*n+j:], hsum4(c0, c1, c2, c3), acc)
}

// bf16Dot returns Σ_{p<k} x[xb+p]·w[wb+p] (AVX2; used for the < 4 weight
// rows left over at the end of a rectangle).
func bf16Dot(xp, wp unsafe.Pointer, xb, wb, k8, k int) float32 {
	var c archsimd.Float32x8
	for p := 0; p < k8; p += 8 {
		c = ldw8(wp, wb+p).MulAdd(ld8(xp, xb+p), c)
	}
	if k8 < k {
		c = tailW8(wp, wb, k8, k).MulAdd(tailLoad(xp, xb, k8, k), c)
	}
	return hsum1(c)
}
