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

// bf16SIMDImpl is the fastest SIMD bf16 kernel for the current variant.
func bf16SIMDImpl() bf16Impl {
	if simdWide {
		return bf16Impl{gemmBF16ZRect, true}
	}
	return bf16Impl{gemmBF16SIMDRect, false}
}

// ldw8 loads 8 bf16 values at p+i widened to float32 (AVX2).
func ldw8(p unsafe.Pointer, i int) archsimd.Float32x8 {
	u := archsimd.LoadUint16x8((*[8]uint16)(unsafe.Add(p, uintptr(i)*2)))
	return u.ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

// tailW8 widens row base's bf16 values [k8, k1) zero-padded to 8
// (k1-k8 < 8; zero bits are +0.0, so the padding adds nothing).
func tailW8(p unsafe.Pointer, base, k8, k1 int) archsimd.Float32x8 {
	var b [8]uint16
	copy(b[:], unsafe.Slice((*uint16)(unsafe.Add(p, uintptr(base+k8)*2)), k1-k8))
	return archsimd.LoadUint16x8(&b).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

// The AVX-512 kernel reads a weight row 32 bf16 (one 64-byte load) at a
// time as a Uint32x16 u: lane l holds element 2l in its low half and 2l+1
// in its high half, so u<<16 is the float32 vector of the even elements and
// u&0xffff0000 that of the odd ones, two cheap ops per 32 weights and no
// widening shuffle. x must then come deinterleaved the same way: the
// caller permutes it once per call into permuteX's layout (see bf16Impl).
// A 16-at-a-time widening (VPMOVZXWD) kernel is slower: through the Go
// compiler's register allocation it streamed weights from memory slower
// in bytes/s than the float32 kernels.

// gemmBF16ZRect computes y[i0:i1, j0:j1] (row stride n) over all of k;
// x is in permuteX's layout, [m, kp] with kp = roundUp(k, 32).
func gemmBF16ZRect(i0, i1, j0, j1, n, k int, x []float32, w []uint16, y []float32, acc bool) {
	kp := (k + 31) &^ 31
	_ = x[i1*kp-1]
	_ = w[j1*k-1]
	_ = y[(i1-1)*n+j1-1]
	k32 := k &^ 31
	j := j0
	for ; j+4 <= j1; j += 4 {
		w0 := unsafe.Pointer(&w[j*k])
		i := i0
		for ; i+2 <= i1; i += 2 {
			bf16Z2x4(unsafe.Pointer(&x[i*kp]), unsafe.Pointer(&x[(i+1)*kp]), w0, k, k32, y[i*n+j:], y[(i+1)*n+j:], acc)
		}
		if i < i1 {
			bf16Z1x4(unsafe.Pointer(&x[i*kp]), w0, k, k32, y[i*n+j:], acc)
		}
	}
	for ; j < j1; j++ {
		w0 := unsafe.Pointer(&w[j*k])
		for i := i0; i < i1; i++ {
			s := bf16Z1(unsafe.Pointer(&x[i*kp]), w0, k, k32)
			if acc {
				s += y[i*n+j]
			}
			y[i*n+j] = s
		}
	}
	archsimd.ClearAVXUpperBits()
}

// ldu32 loads 32 bf16 at p + i elements as a Uint32x16 (pairs).
func ldu32(p unsafe.Pointer, i int) archsimd.Uint32x16 {
	return archsimd.LoadUint32x16((*[16]uint32)(unsafe.Add(p, uintptr(i)*2)))
}

// tailU32 is ldu32 for the last k-k32 < 32 bf16 of a row, zero-padded.
func tailU32(p unsafe.Pointer, k32, k int) archsimd.Uint32x16 {
	var b [16]uint32
	copy(unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), 32), unsafe.Slice((*uint16)(unsafe.Add(p, uintptr(k32)*2)), k-k32))
	return archsimd.LoadUint32x16(&b)
}

var hiMask = archsimd.BroadcastUint32x16(0xffff0000)

// bf16Z1x4: y0[c] (+)= Σ_p x[p]·w[c·k+p] for c < 4; xr is one permuted x
// row, w0 the first of 4 consecutive weight rows.
func bf16Z1x4(xr, w0 unsafe.Pointer, k, k32 int, y0 []float32, acc bool) {
	w1, w2, w3 := unsafe.Add(w0, k*2), unsafe.Add(w0, 2*k*2), unsafe.Add(w0, 3*k*2)
	mask := hiMask
	var c0, c1, c2, c3, d0, d1, d2, d3 archsimd.Float32x16
	p := 0
	for ; p < k32; p += 32 {
		xe, xo := ld16(xr, p), ld16(xr, p+16)
		u := ldu32(w0, p)
		c0 = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(xe, c0)
		d0 = u.And(mask).AsFloat32x16().MulAdd(xo, d0)
		u = ldu32(w1, p)
		c1 = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(xe, c1)
		d1 = u.And(mask).AsFloat32x16().MulAdd(xo, d1)
		u = ldu32(w2, p)
		c2 = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(xe, c2)
		d2 = u.And(mask).AsFloat32x16().MulAdd(xo, d2)
		u = ldu32(w3, p)
		c3 = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(xe, c3)
		d3 = u.And(mask).AsFloat32x16().MulAdd(xo, d3)
	}
	if p < k {
		xe, xo := ld16(xr, p), ld16(xr, p+16)
		u := tailU32(w0, p, k)
		c0 = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(xe, c0)
		d0 = u.And(mask).AsFloat32x16().MulAdd(xo, d0)
		u = tailU32(w1, p, k)
		c1 = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(xe, c1)
		d1 = u.And(mask).AsFloat32x16().MulAdd(xo, d1)
		u = tailU32(w2, p, k)
		c2 = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(xe, c2)
		d2 = u.And(mask).AsFloat32x16().MulAdd(xo, d2)
		u = tailU32(w3, p, k)
		c3 = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(xe, c3)
		d3 = u.And(mask).AsFloat32x16().MulAdd(xo, d3)
	}
	c0, c1, c2, c3 = c0.Add(d0), c1.Add(d1), c2.Add(d2), c3.Add(d3)
	store4v(y0, hsum4(fold16(c0), fold16(c1), fold16(c2), fold16(c3)), acc)
}

// bf16Z2x4 is bf16Z1x4 for two x rows (x0r, x1r → y0, y1), 8 accumulators
// (even and odd halves of a pair summed into the same one).
func bf16Z2x4(x0r, x1r, w0 unsafe.Pointer, k, k32 int, y0, y1 []float32, acc bool) {
	w1, w2, w3 := unsafe.Add(w0, k*2), unsafe.Add(w0, 2*k*2), unsafe.Add(w0, 3*k*2)
	mask := hiMask
	var c00, c01, c02, c03, c10, c11, c12, c13 archsimd.Float32x16
	kk := (k + 31) &^ 31
	for p := 0; p < kk; p += 32 {
		xe0, xo0 := ld16(x0r, p), ld16(x0r, p+16)
		xe1, xo1 := ld16(x1r, p), ld16(x1r, p+16)
		var u0, u1, u2, u3 archsimd.Uint32x16
		if p < k32 {
			u0, u1, u2, u3 = ldu32(w0, p), ldu32(w1, p), ldu32(w2, p), ldu32(w3, p)
		} else {
			u0, u1, u2, u3 = tailU32(w0, p, k), tailU32(w1, p, k), tailU32(w2, p, k), tailU32(w3, p, k)
		}
		e, o := u0.ShiftAllLeft(16).AsFloat32x16(), u0.And(mask).AsFloat32x16()
		c00, c10 = o.MulAdd(xo0, e.MulAdd(xe0, c00)), o.MulAdd(xo1, e.MulAdd(xe1, c10))
		e, o = u1.ShiftAllLeft(16).AsFloat32x16(), u1.And(mask).AsFloat32x16()
		c01, c11 = o.MulAdd(xo0, e.MulAdd(xe0, c01)), o.MulAdd(xo1, e.MulAdd(xe1, c11))
		e, o = u2.ShiftAllLeft(16).AsFloat32x16(), u2.And(mask).AsFloat32x16()
		c02, c12 = o.MulAdd(xo0, e.MulAdd(xe0, c02)), o.MulAdd(xo1, e.MulAdd(xe1, c12))
		e, o = u3.ShiftAllLeft(16).AsFloat32x16(), u3.And(mask).AsFloat32x16()
		c03, c13 = o.MulAdd(xo0, e.MulAdd(xe0, c03)), o.MulAdd(xo1, e.MulAdd(xe1, c13))
	}
	store4v(y0, hsum4(fold16(c00), fold16(c01), fold16(c02), fold16(c03)), acc)
	store4v(y1, hsum4(fold16(c10), fold16(c11), fold16(c12), fold16(c13)), acc)
}

// bf16Z1 returns Σ_p x[p]·w[p] for one permuted x row and one weight row.
func bf16Z1(xr, w0 unsafe.Pointer, k, k32 int) float32 {
	mask := hiMask
	var c, d archsimd.Float32x16
	p := 0
	for ; p < k32; p += 32 {
		u := ldu32(w0, p)
		c = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(ld16(xr, p), c)
		d = u.And(mask).AsFloat32x16().MulAdd(ld16(xr, p+16), d)
	}
	if p < k {
		u := tailU32(w0, p, k)
		c = u.ShiftAllLeft(16).AsFloat32x16().MulAdd(ld16(xr, p), c)
		d = u.And(mask).AsFloat32x16().MulAdd(ld16(xr, p+16), d)
	}
	return hsum1(fold16(c.Add(d)))
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
	j := j0
	for ; j+4 <= j1; j += 4 {
		i := i0
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
