package cpu

import (
	"fmt"
	"math"
)

// int8 weight-only GEMM for small M (decode). A decode step at batch 1 is
// bound by the bytes of weights it streams; int8 weights are half the
// bytes of bf16 (the shipped model: 16.6 MB instead of 33 MB, which fits
// this machine's last-level cache where 33 MB does not). Each weight row j
// (output channel) is stored as int8 q[j,·] with one float32 scale s[j]
// (symmetric, s = max|w[j,·]|/127), so
//
//	y[i,j] = s[j] · Σ_p x[i,p]·q[j,p]
//
// Activations stay float32; only the weights are rounded (relative error
// ≤ 1/254 of the row's largest weight per weight). This is lossy, unlike
// the bf16 path; the forward pass only uses it when asked
// (forward.CPUOptions.Int8).

// QuantizeInt8 returns the per-row symmetric int8 quantisation of w
// [n,k]: q [n,k] and scale [n] with w[j,p] ≈ scale[j]·q[j,p], q in
// [-127, 127] (round to nearest, ties away from zero). A row of zeros
// gets scale 0. Non-finite weights are not supported (the scale of their
// row becomes non-finite).
func QuantizeInt8(n, k int, w []float32) (q []int8, scale []float32) {
	if n < 0 || k < 0 || len(w) < n*k {
		panic(fmt.Sprintf("cpu.QuantizeInt8: bad shapes n=%d k=%d len(w)=%d", n, k, len(w)))
	}
	q = make([]int8, n*k)
	scale = make([]float32, n)
	for j := 0; j < n; j++ {
		row := w[j*k : j*k+k]
		var amax float32
		for _, v := range row {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		if amax == 0 {
			continue
		}
		s := amax / 127
		scale[j] = s
		inv := 1 / float64(s)
		for p, v := range row {
			r := math.Round(float64(v) * inv)
			q[j*k+p] = int8(max(-127, min(127, r)))
		}
	}
	return q, scale
}

// HasFastInt8 reports whether GemmInt8 runs a vectorised (assembly)
// kernel here (not after SetGEMMPath("go"); OpenBLAS or not, see
// HasFastBF16); when false it runs plain Go, slower than Gemm on float32.
func HasFastInt8() bool { return int8AsmAvailable() && !goForced }

func checkGemmInt8(m, n, k int, x []float32, q []int8, s, y []float32) {
	if m < 0 || n < 0 || k < 0 || len(x) < m*k || len(q) < n*k || len(s) < n || len(y) < m*n {
		panic(fmt.Sprintf("cpu.GemmInt8: bad shapes m=%d n=%d k=%d len(x)=%d len(q)=%d len(scale)=%d len(y)=%d",
			m, n, k, len(x), len(q), len(s), len(y)))
	}
}

// GemmInt8 computes y[m,n] = x[m,k] · (scale ⊙ q)[n,k]ᵀ, overwriting y,
// with q, scale as QuantizeInt8 returns them ([out,in] layout). Meant for
// small m (decode). y must not overlap x; only the first m·k, n·k, n and
// m·n elements are used. Safe for concurrent use, like Gemm.
func GemmInt8(m, n, k int, x []float32, q []int8, scale, y []float32) {
	checkGemmInt8(m, n, k, x, q, scale, y)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		clear(y[:m*n])
		return
	}
	runGemmInt8(m, n, k, x, q, scale, y, false, chooseInt8())
}

// GemmInt8Acc computes y[m,n] += x[m,k] · (scale ⊙ q)[n,k]ᵀ (see
// GemmInt8).
func GemmInt8Acc(m, n, k int, x []float32, q []int8, scale, y []float32) {
	checkGemmInt8(m, n, k, x, q, scale, y)
	if m == 0 || n == 0 || k == 0 {
		return
	}
	runGemmInt8(m, n, k, x, q, scale, y, true, chooseInt8())
}

// int8Kernel computes y[i0:i1, j0:j1] (row stride n) = x·(s⊙q)ᵀ (+ y if
// acc) over all of k; x [m,k], q [n,k], s [n].
type int8Kernel func(i0, i1, j0, j1, n, k int, x []float32, q []int8, s, y []float32, acc bool)

func chooseInt8() int8Kernel {
	if HasFastInt8() {
		return int8AsmKernel()
	}
	return gemmInt8GoRect
}

// gemmInt8Ref is the obviously-correct reference (float64 accumulation).
func gemmInt8Ref(m, n, k int, x []float32, q []int8, s, y []float32, acc bool) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var d float64
			for p := 0; p < k; p++ {
				d += float64(x[i*k+p]) * float64(q[j*k+p])
			}
			d *= float64(s[j])
			if acc {
				d += float64(y[i*n+j])
			}
			y[i*n+j] = float32(d)
		}
	}
}

// gemmInt8GoRect is the plain-Go kernel (one dot product at a time).
func gemmInt8GoRect(i0, i1, j0, j1, n, k int, x []float32, q []int8, s, y []float32, acc bool) {
	for i := i0; i < i1; i++ {
		xr := x[i*k : i*k+k]
		for j := j0; j < j1; j++ {
			v := s[j] * int8Dot(xr, q[j*k:j*k+k], 0)
			if acc {
				v += y[i*n+j]
			}
			y[i*n+j] = v
		}
	}
}

// int8Dot returns Σ_{p0 ≤ p < len(qr)} xr[p]·qr[p] (unscaled).
func int8Dot(xr []float32, qr []int8, p0 int) float32 {
	xr = xr[:len(qr)]
	var d float32
	for p := p0; p < len(qr); p++ {
		d += xr[p] * float32(qr[p])
	}
	return d
}

// int8Job is one parallel int8 GEMM; the single instance theInt8Job is
// guarded by poolMu (see pool.go). Parts split the weight rows [0,n) on
// multiples of 4 (the microkernel width).
type int8Job struct {
	m, n, k int
	x       []float32 // [m,k]
	q       []int8    // [n,k]
	s       []float32 // [n]
	y       []float32 // [m,n]
	acc     bool
	kern    int8Kernel
}

var theInt8Job int8Job

func (g *int8Job) run(p, np int) {
	j0, j1 := split(g.n, np, p, 4)
	if j0 < j1 {
		g.kern(0, g.m, j0, j1, g.n, g.k, g.x, g.q, g.s, g.y, g.acc)
	}
}

// runGemmInt8 runs kern over the whole product, split by weight rows over
// the pool under the same rule as runGemmBF16 (splitLowP: enough weight
// bytes or enough flops; smaller products run on the caller, where a
// hand-off costs more than it saves).
func runGemmInt8(m, n, k int, x []float32, q []int8, s, y []float32, acc bool, kern int8Kernel) {
	parts := min(Threads(), max(1, n/16))
	if !splitLowP(m, n, k, n*k) {
		parts = 1
	}
	if parts <= 1 {
		kern(0, m, 0, n, n, k, x, q, s, y, acc)
		return
	}
	poolMu.Lock()
	theInt8Job = int8Job{m, n, k, x, q, s, y, acc, kern}
	runPartsChunked(&theInt8Job, parts, gemmChunks(m))
	theInt8Job = int8Job{} // do not keep the caller's buffers alive
	poolMu.Unlock()
}
