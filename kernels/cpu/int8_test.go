package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// int8Case is one int8 kernel under test.
type int8Case struct {
	name string
	kern int8Kernel
	set  func() (restore func())
}

func int8Cases() []int8Case {
	cs := []int8Case{{"go", gemmInt8GoRect, func() func() { return func() {} }}}
	if int8AsmAvailable() {
		for _, v := range asmVariants() {
			cs = append(cs, int8Case{"asm-" + v, int8AsmKernel(), func() func() { return setAsmVariant(v) }})
		}
	}
	return cs
}

func randInt8(r *rand.Rand, n int) []int8 {
	q := make([]int8, n)
	for i := range q {
		q[i] = int8(r.IntN(255) - 127)
	}
	return q
}

// TestGemmInt8 compares every kernel, overwrite and accumulate, against the
// float64 reference over odd shapes: M=1..9 (every tile height and
// leftovers), N and K not multiples of 4/8/16/32, and sizes large enough to
// split over the pool and to block the weight rows. Tolerance is relative
// to Σ|x·s·q|, the scale of float32 rounding in any summation order.
func TestGemmInt8(t *testing.T) {
	type shape struct{ n, k int }
	var shapes []shape
	for _, n := range []int{1, 3, 4, 5, 17, 33, 100, 131} {
		for _, k := range []int{1, 7, 8, 15, 16, 17, 31, 32, 33, 100, 384, 1031} {
			shapes = append(shapes, shape{n, k})
		}
	}
	shapes = append(shapes, shape{2051, 512}) // ≥ 1 MiB: split over the pool
	for _, c := range int8Cases() {
		t.Run(c.name, func(t *testing.T) {
			defer c.set()()
			r := rand.New(rand.NewPCG(7, 8))
			for m := 1; m <= 9; m++ {
				for _, s := range shapes {
					if s.n > 1000 && m > 3 {
						continue
					}
					for _, acc := range []bool{false, true} {
						checkInt8Case(t, c.kern, r, m, s.n, s.k, acc)
					}
				}
			}
		})
	}
}

func checkInt8Case(t *testing.T, kern int8Kernel, r *rand.Rand, m, n, k int, acc bool) {
	t.Helper()
	x := randSlice(r, m*k)
	q := randInt8(r, n*k)
	s := make([]float32, n)
	for j := range s {
		s[j] = float32(r.Float64()) / 64
	}
	y0 := randSlice(r, m*n)
	want := append([]float32(nil), y0...)
	gemmInt8Ref(m, n, k, x, q, s, want, acc)
	got := append([]float32(nil), y0...)
	runGemmInt8(m, n, k, x, q, s, got, acc, kern)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var scale float64
			for p := 0; p < k; p++ {
				scale += math.Abs(float64(x[i*k+p]) * float64(q[j*k+p]) * float64(s[j]))
			}
			if acc {
				scale += math.Abs(float64(y0[i*n+j]))
			}
			tol := 1e-6*scale + 1e-30
			if d := math.Abs(float64(got[i*n+j] - want[i*n+j])); d > tol {
				t.Fatalf("m=%d n=%d k=%d acc=%v: y[%d,%d]=%g, want %g (|Δ|=%g > %g)",
					m, n, k, acc, i, j, got[i*n+j], want[i*n+j], d, tol)
			}
		}
	}
}

// (67×203×389 splits over the pool by its flops, 8×6294×384 by its
// weight bytes; see splitLowP.)
// TestGemmInt8Exported checks the public entry points, including k=0 and
// empty shapes, against the reference.
func TestGemmInt8Exported(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, sh := range []struct{ m, n, k int }{{1, 384, 384}, {3, 1031, 77}, {8, 6294, 384}, {67, 203, 389}, {2, 5, 0}, {0, 4, 4}, {4, 0, 4}} {
		t.Run(fmt.Sprintf("%dx%dx%d", sh.m, sh.n, sh.k), func(t *testing.T) {
			x := randSlice(r, sh.m*sh.k)
			q, s := QuantizeInt8(sh.n, sh.k, randSlice(r, sh.n*sh.k))
			y := randSlice(r, sh.m*sh.n)
			want := append([]float32(nil), y...)
			gemmInt8Ref(sh.m, sh.n, sh.k, x, q, s, want, true)
			GemmInt8Acc(sh.m, sh.n, sh.k, x, q, s, y)
			if d := maxDiff32(y, want); d > 1e-4 {
				t.Fatalf("GemmInt8Acc: max |Δ| %g", d)
			}
			gemmInt8Ref(sh.m, sh.n, sh.k, x, q, s, want, false)
			GemmInt8(sh.m, sh.n, sh.k, x, q, s, y)
			if d := maxDiff32(y, want); d > 1e-4 {
				t.Fatalf("GemmInt8: max |Δ| %g", d)
			}
		})
	}
}

// TestQuantizeInt8 checks the rounding contract: every weight is within
// half a step (scale/2) of scale·q, q stays in [-127,127], each row's
// largest |weight| maps to ±127, and a zero row gets scale 0.
func TestQuantizeInt8(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const n, k = 37, 53
	w := randSlice(r, n*k)
	for p := 0; p < k; p++ {
		w[5*k+p] = 0 // row 5 all zeros
	}
	w[7*k+3] = -9 // row 7 dominated by one negative weight
	q, s := QuantizeInt8(n, k, w)
	for j := 0; j < n; j++ {
		var amax float64
		hit := false
		for p := 0; p < k; p++ {
			v, qq := float64(w[j*k+p]), q[j*k+p]
			amax = max(amax, math.Abs(v))
			if qq < -127 {
				t.Fatalf("q[%d,%d] = %d < -127", j, p, qq)
			}
			if d := math.Abs(v - float64(s[j])*float64(qq)); d > float64(s[j])/2*(1+1e-6) {
				t.Fatalf("w[%d,%d]=%g, scale %g · q %d off by %g", j, p, v, s[j], qq, d)
			}
			if qq == 127 || qq == -127 {
				hit = true
			}
		}
		if amax == 0 {
			if s[j] != 0 {
				t.Fatalf("zero row %d: scale %g", j, s[j])
			}
			continue
		}
		if !hit {
			t.Fatalf("row %d: no weight maps to ±127", j)
		}
	}
	if q[7*k+3] != -127 {
		t.Fatalf("row 7's dominant weight maps to %d, want -127", q[7*k+3])
	}
}

func TestGemmInt8BadShapes(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a short scale")
		}
	}()
	GemmInt8(2, 3, 4, make([]float32, 8), make([]int8, 12), make([]float32, 2), make([]float32, 6))
}
