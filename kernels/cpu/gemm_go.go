package cpu

// Plain-Go GEMM. y = x·wᵀ is a grid of dot products of x rows with w rows,
// both contiguous in k, so no packing is needed. The Go compiler does not
// interleave loads and multiply-adds well and has 16 float registers, so
// small tiles win (4×4 spills; docs/DECISIONS.md, "GEMM tiles and
// blocking"). The main tile is 2×2; an odd last row uses 1×4. K is blocked
// so the row segments stay in L1.

const goKB = 512 // k block (floats): 6 rows × 2 KiB in a 32 KiB L1

func gemmGo(m, n, k int, x, w, y []float32, acc bool) {
	runGemm(m, n, k, x, w, y, acc, 2, 4, gemmGoRect)
}

// goMB bounds the x rows swept per k block (goMB × goKB floats = 128 KiB,
// in L2).
const goMB = 64

// gemmGoRect computes y[i0:i1, j0:j1] (row stride n) for the full k.
func gemmGoRect(i0, i1, j0, j1, n, k int, x, w, y []float32, acc bool) {
	for ib := i0; ib < i1; ib += goMB {
		gemmGoBlock(ib, min(i1, ib+goMB), j0, j1, n, k, x, w, y, acc)
	}
}

func gemmGoBlock(i0, i1, j0, j1, n, k int, x, w, y []float32, acc bool) {
	for k0 := 0; k0 < k; k0 += goKB {
		k1 := min(k, k0+goKB)
		accum := acc || k0 > 0
		row := func(r int, buf []float32) []float32 { return buf[r*k+k0 : r*k+k1] }
		j := j0
		for ; j+4 <= j1; j += 4 {
			w0, w1, w2, w3 := row(j, w), row(j+1, w), row(j+2, w), row(j+3, w)
			i := i0
			for ; i+2 <= i1; i += 2 {
				x0, x1 := row(i, x), row(i+1, x)
				micro2x2Go(x0, x1, w0, w1, y[i*n+j:], n, accum)
				micro2x2Go(x0, x1, w2, w3, y[i*n+j+2:], n, accum)
			}
			if i < i1 {
				micro1x4Go(row(i, x), w0, w1, w2, w3, y[i*n+j:i*n+j+4], accum)
			}
		}
		for ; j < j1; j++ {
			for i := i0; i < i1; i++ {
				s := dotGo(row(i, x), row(j, w))
				if accum {
					s += y[i*n+j]
				}
				y[i*n+j] = s
			}
		}
	}
}

// micro2x2Go: y[r*ldy+c] (+)= Σ_p x_r[p]·w_c[p] for r,c in {0,1}, p < len(x0).
func micro2x2Go(x0, x1, w0, w1, y []float32, ldy int, acc bool) {
	kk := len(x0)
	x1, w0, w1 = x1[:kk], w0[:kk], w1[:kk]
	var s00, s01, s10, s11 float32
	for p, a := range x0 {
		b0, b1 := w0[p], w1[p]
		s00 += a * b0
		s01 += a * b1
		c := x1[p]
		s10 += c * b0
		s11 += c * b1
	}
	y0 := y[0:2]
	y1 := y[ldy : ldy+2]
	if acc {
		s00 += y0[0]
		s01 += y0[1]
		s10 += y1[0]
		s11 += y1[1]
	}
	y0[0], y0[1], y1[0], y1[1] = s00, s01, s10, s11
}

// micro1x4Go: y[c] (+)= Σ_p x[p]·w_c[p] for c < 4.
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
