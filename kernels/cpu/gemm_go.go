package cpu

// Plain-Go GEMM. y = x·wᵀ is a grid of dot products of x rows with w rows,
// both contiguous in k, so no packing is needed: the microkernel takes 4 rows
// of x and 4 rows of w and keeps the 16 running sums in registers, loading 8
// values per 16 multiply-adds. K is blocked so the 8 row segments stay in L1.

const goKB = 512 // k block (floats): 8 rows × 2 KiB fits in a 32 KiB L1

func gemmGo(m, n, k int, x, w, y []float32, acc bool) {
	runGemm(m, n, k, x, w, y, acc, 4, 4, gemmGoRect)
}

// gemmGoRect computes y[i0:i1, j0:j1] (row stride n) for the full k.
func gemmGoRect(i0, i1, j0, j1, n, k int, x, w, y []float32, acc bool) {
	for k0 := 0; k0 < k; k0 += goKB {
		k1 := min(k, k0+goKB)
		accum := acc || k0 > 0
		for j := j0; j < j1; j += 4 {
			if j+4 > j1 {
				for jj := j; jj < j1; jj++ {
					for i := i0; i < i1; i++ {
						s := dotGo(x[i*k+k0:i*k+k1], w[jj*k+k0:jj*k+k1])
						if accum {
							s += y[i*n+jj]
						}
						y[i*n+jj] = s
					}
				}
				break
			}
			w0 := w[(j+0)*k+k0 : (j+0)*k+k1]
			w1 := w[(j+1)*k+k0 : (j+1)*k+k1]
			w2 := w[(j+2)*k+k0 : (j+2)*k+k1]
			w3 := w[(j+3)*k+k0 : (j+3)*k+k1]
			i := i0
			for ; i+4 <= i1; i += 4 {
				micro4x4Go(x[i*k+k0:], x[(i+1)*k+k0:], x[(i+2)*k+k0:], x[(i+3)*k+k0:],
					w0, w1, w2, w3, y[i*n+j:], n, accum)
			}
			for ; i < i1; i++ {
				micro1x4Go(x[i*k+k0:i*k+k1], w0, w1, w2, w3, y[i*n+j:i*n+j+4], accum)
			}
		}
	}
}

// micro4x4Go: y[r*ldy+c] (+)= Σ_p x_r[p]·w_c[p] for r,c in 0..3, p < len(w0).
func micro4x4Go(x0, x1, x2, x3, w0, w1, w2, w3, y []float32, ldy int, acc bool) {
	kk := len(w0)
	x0, x1, x2, x3 = x0[:kk], x1[:kk], x2[:kk], x3[:kk]
	w1, w2, w3 = w1[:kk], w2[:kk], w3[:kk]
	var s00, s01, s02, s03, s10, s11, s12, s13 float32
	var s20, s21, s22, s23, s30, s31, s32, s33 float32
	for p := range kk {
		a0, a1, a2, a3 := x0[p], x1[p], x2[p], x3[p]
		b0, b1, b2, b3 := w0[p], w1[p], w2[p], w3[p]
		s00 += a0 * b0
		s01 += a0 * b1
		s02 += a0 * b2
		s03 += a0 * b3
		s10 += a1 * b0
		s11 += a1 * b1
		s12 += a1 * b2
		s13 += a1 * b3
		s20 += a2 * b0
		s21 += a2 * b1
		s22 += a2 * b2
		s23 += a2 * b3
		s30 += a3 * b0
		s31 += a3 * b1
		s32 += a3 * b2
		s33 += a3 * b3
	}
	store4(y[0:4], s00, s01, s02, s03, acc)
	store4(y[ldy:ldy+4], s10, s11, s12, s13, acc)
	store4(y[2*ldy:2*ldy+4], s20, s21, s22, s23, acc)
	store4(y[3*ldy:3*ldy+4], s30, s31, s32, s33, acc)
}

func micro1x4Go(x, w0, w1, w2, w3, y []float32, acc bool) {
	kk := len(x)
	w0, w1, w2, w3 = w0[:kk], w1[:kk], w2[:kk], w3[:kk]
	var s0, s1, s2, s3 float32
	for p, a := range x {
		s0 += a * w0[p]
		s1 += a * w1[p]
		s2 += a * w2[p]
		s3 += a * w3[p]
	}
	store4(y, s0, s1, s2, s3, acc)
}

func store4(y []float32, a, b, c, d float32, acc bool) {
	y = y[:4]
	if acc {
		y[0] += a
		y[1] += b
		y[2] += c
		y[3] += d
		return
	}
	y[0], y[1], y[2], y[3] = a, b, c, d
}

// dotGo is a 4-way unrolled dot product (independent partial sums hide the
// add latency).
func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}
