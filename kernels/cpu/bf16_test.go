package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// bf16Case is one bf16 kernel under test: the assembly kernel per variant
// the CPU runs, and the plain-Go one always.
type bf16Case struct {
	name string
	set  func() (restore func())
}

func bf16Cases() []bf16Case {
	cs := []bf16Case{{"go", func() func() { return withBF16Impl(bf16Impl{gemmBF16GoRect, false}) }}}
	for _, v := range asmVariants() {
		cs = append(cs, bf16Case{"asm-" + v, func() func() {
			r := setAsmVariant(v)
			return withBF16Impl(bf16AsmImpl(), r)
		}})
	}
	return cs
}

// withBF16Impl makes testImpl im and returns a restore func that also
// runs then.
func withBF16Impl(im bf16Impl, then ...func()) func() {
	old := testImpl
	testImpl = im
	return func() {
		testImpl = old
		for _, f := range then {
			f()
		}
	}
}

// testImpl is the kernel TestGemmBF16 drives (set by bf16Cases).
var testImpl bf16Impl

func randBF16(r *rand.Rand, n int) []uint16 {
	w := make([]uint16, n)
	for i := range w {
		w[i] = BF16Bits(float32(r.NormFloat64()))
	}
	return w
}

// TestGemmBF16 compares every kernel, overwrite and accumulate, against the
// float64 reference over odd shapes: M=1..9 (both microkernel row paths and
// leftovers), N and K not multiples of 4/8/16, K=0, and sizes large enough
// to split over the pool. Tolerance is relative to Σ|x·w|, the scale of the
// float32 rounding error of any summation order.
func TestGemmBF16(t *testing.T) {
	ns := []int{1, 3, 4, 5, 17, 33, 100, 131}
	ks := []int{0, 1, 7, 8, 15, 16, 17, 31, 33, 100, 384, 1031}
	for _, c := range bf16Cases() {
		t.Run(c.name, func(t *testing.T) {
			defer c.set()()
			r := rand.New(rand.NewPCG(3, 4))
			for m := 1; m <= 9; m++ {
				for _, n := range ns {
					for _, k := range ks {
						for _, acc := range []bool{false, true} {
							checkBF16Case(t, testImpl, r, m, n, k, acc)
						}
					}
				}
			}
		})
	}
}

func checkBF16Case(t *testing.T, im bf16Impl, r *rand.Rand, m, n, k int, acc bool) {
	t.Helper()
	x := randSlice(r, m*k)
	w := randBF16(r, n*k)
	y0 := randSlice(r, m*n)
	want := append([]float32(nil), y0...)
	gemmBF16Ref(m, n, k, x, w, want, acc)
	got := append([]float32(nil), y0...)
	if k == 0 && !acc { // the exported entry point handles k=0
		GemmBF16(m, n, k, x, w, got)
	} else if m*n > 0 && k > 0 {
		runGemmBF16(m, n, k, x, w, got, acc, im)
	}
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var scale float64
			for p := 0; p < k; p++ {
				scale += math.Abs(float64(x[i*k+p]) * float64(BF16ToFloat32(w[j*k+p])))
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
// TestGemmBF16Exported checks the public entry points (path choice, k=0,
// accumulate) and that GemmBF16 on bf16 weights matches Gemm on the same
// weights widened to float32.
func TestGemmBF16Exported(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, s := range []struct{ m, n, k int }{{1, 384, 384}, {3, 1031, 77}, {8, 6294, 384}, {67, 203, 389}, {2, 5, 0}, {0, 4, 4}, {4, 0, 4}} {
		t.Run(fmt.Sprintf("%dx%dx%d", s.m, s.n, s.k), func(t *testing.T) {
			x := randSlice(r, s.m*s.k)
			w := randBF16(r, s.n*s.k)
			wf := make([]float32, len(w))
			for i, b := range w {
				wf[i] = BF16ToFloat32(b)
			}
			y := randSlice(r, s.m*s.n)
			yf := append([]float32(nil), y...)
			GemmBF16Acc(s.m, s.n, s.k, x, w, y)
			GemmAcc(s.m, s.n, s.k, x, wf, yf)
			if d := maxDiff32(y, yf); d > 1e-3 {
				t.Fatalf("GemmBF16Acc vs GemmAcc: max |Δ| %g", d)
			}
			GemmBF16(s.m, s.n, s.k, x, w, y)
			Gemm(s.m, s.n, s.k, x, wf, yf)
			if d := maxDiff32(y, yf); d > 1e-3 {
				t.Fatalf("GemmBF16 vs Gemm: max |Δ| %g", d)
			}
		})
	}
}

func maxDiff32(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

func TestGemmBF16BadShapes(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a short w")
		}
	}()
	GemmBF16(2, 3, 4, make([]float32, 8), make([]uint16, 11), make([]float32, 6))
}

func TestBF16Bits(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{0, 0}, {1, 0x3f80}, {-2, 0xc000},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie → even
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie → even (up)
		{math.Float32frombits(0x3f808001), 0x3f81}, // above the tie
		{float32(math.Inf(1)), 0x7f80},
	} {
		if got := BF16Bits(c.f); got != c.want {
			t.Errorf("BF16Bits(%g)=%#x, want %#x", c.f, got, c.want)
		}
	}
	if nan := BF16ToFloat32(BF16Bits(float32(math.NaN()))); nan == nan {
		t.Error("NaN did not stay NaN")
	}
}

// BenchmarkGemmBF16 compares, in one run, GemmBF16 on bf16 weights with
// Gemm on the same weights in float32 at the model's shapes and small M.
// GB/s counts the weight bytes only (the traffic that matters at small M).
// go test -run '^$' -bench GemmBF16 -benchtime=200ms ./kernels/cpu
func BenchmarkGemmBF16(b *testing.B) {
	for _, nk := range benchNK {
		for _, m := range []int{1, 2, 4, 8, 16, 64, 512} {
			r := rand.New(rand.NewPCG(1, 2))
			x := randSlice(r, m*nk.k)
			w := randBF16(r, nk.n*nk.k)
			wf := make([]float32, len(w))
			for i, v := range w {
				wf[i] = BF16ToFloat32(v)
			}
			y := make([]float32, m*nk.n)
			report := func(b *testing.B, wbytes int) {
				s := b.Elapsed().Seconds()
				b.ReportMetric(2*float64(m*nk.n*nk.k)*float64(b.N)/s/1e9, "GFLOP/s")
				b.ReportMetric(float64(wbytes)*float64(b.N)/s/1e9, "GB/s")
			}
			b.Run(fmt.Sprintf("bf16/%s/M=%d", nk.name, m), func(b *testing.B) {
				GemmBF16(m, nk.n, nk.k, x, w, y)
				for b.Loop() {
					GemmBF16(m, nk.n, nk.k, x, w, y)
				}
				report(b, 2*len(w))
			})
			b.Run(fmt.Sprintf("fp32/%s/M=%d", nk.name, m), func(b *testing.B) {
				Gemm(m, nk.n, nk.k, x, wf, y)
				for b.Loop() {
					Gemm(m, nk.n, nk.k, x, wf, y)
				}
				report(b, 4*len(wf))
			})
		}
	}
}

// BenchmarkGemmBF16Stream is BenchmarkGemmBF16 with the weights streamed
// from memory, as in a decode step: each op cycles through enough copies of
// the weight matrix (≥ 64 MiB of float32) that none is still in cache.
func BenchmarkGemmBF16Stream(b *testing.B) {
	for _, nk := range benchNK {
		copies := max(2, (64<<20)/(4*nk.n*nk.k))
		for _, m := range []int{1, 2, 4, 8} {
			r := rand.New(rand.NewPCG(1, 2))
			x := randSlice(r, m*nk.k)
			ws := make([][]uint16, copies)
			wfs := make([][]float32, copies)
			for c := range ws {
				ws[c] = randBF16(r, nk.n*nk.k)
				wfs[c] = make([]float32, nk.n*nk.k)
				for i, v := range ws[c] {
					wfs[c][i] = BF16ToFloat32(v)
				}
			}
			y := make([]float32, m*nk.n)
			report := func(b *testing.B, wbytes int) {
				s := b.Elapsed().Seconds()
				b.ReportMetric(2*float64(m*nk.n*nk.k)*float64(b.N)/s/1e9, "GFLOP/s")
				b.ReportMetric(float64(wbytes)*float64(b.N)/s/1e9, "GB/s")
			}
			b.Run(fmt.Sprintf("bf16/%s/M=%d", nk.name, m), func(b *testing.B) {
				i := 0
				for b.Loop() {
					GemmBF16(m, nk.n, nk.k, x, ws[i%copies], y)
					i++
				}
				report(b, 2*nk.n*nk.k)
			})
			b.Run(fmt.Sprintf("fp32/%s/M=%d", nk.name, m), func(b *testing.B) {
				i := 0
				for b.Loop() {
					Gemm(m, nk.n, nk.k, x, wfs[i%copies], y)
					i++
				}
				report(b, 4*nk.n*nk.k)
			})
		}
	}
}

// TestFastKernelsIndependentOfGemmPath: whether the bf16 and int8 GEMMs run
// their vector kernels depends on the CPU and CHUNLIAN_GEMM=go only, not on
// which float32 GEMM kernel runs (setPath). A machine without OpenBLAS
// runs the float32 GEMM in plain Go ("asm") and must keep the assembly, or
// every GEMM there runs in plain Go.
func TestFastKernelsIndependentOfGemmPath(t *testing.T) {
	for _, p := range availablePaths() {
		withPath(t, p, func() {
			if got, want := HasFastBF16(), bf16AsmAvailable() && !goForced; got != want {
				t.Errorf("path %s: HasFastBF16() = %v, want %v", p, got, want)
			}
			if got, want := HasFastInt8(), int8AsmAvailable() && !goForced; got != want {
				t.Errorf("path %s: HasFastInt8() = %v, want %v", p, got, want)
			}
		})
	}
	old := goForced
	goForced = true // as CHUNLIAN_GEMM=go sets it at start
	defer func() { goForced = old }()
	if HasFastBF16() || HasFastInt8() {
		t.Errorf("CHUNLIAN_GEMM=go: HasFastBF16() = %v, HasFastInt8() = %v, want false", HasFastBF16(), HasFastInt8())
	}
}

// TestKernels: the start-up description follows the path and the switches.
func TestKernels(t *testing.T) {
	for _, p := range availablePaths() {
		withPath(t, p, func() {
			k := Kernels()
			if !strings.HasPrefix(k, "gemm="+p+" ") {
				t.Errorf("path %s: Kernels() = %q", p, k)
			}
			if bf16AsmAvailable() && !goForced && !strings.Contains(k, " bf16=asm-"+asmName()+" ") {
				t.Errorf("path %s: Kernels() = %q, want bf16=asm-%s", p, k, asmName())
			}
		})
	}
	old := goForced
	goForced = true
	defer func() { goForced = old }()
	if k := Kernels(); !strings.Contains(k, " bf16=go int8=go ") {
		t.Errorf("CHUNLIAN_GEMM=go: Kernels() = %q, want bf16=go int8=go", k)
	}
}

// bf16DotCases are GemmBF16Dot's two paths: the VDPBF16PS kernels where
// the CPU has them, and the fallback (rounded x on GemmBF16's kernel).
func bf16DotCases(t testing.TB) []struct {
	name string
	on   bool
} {
	cs := []struct {
		name string
		on   bool
	}{{"fallback", false}}
	restore := setBF16DotAsm(true)
	defer restore()
	if HasBF16Dot() {
		cs = append(cs, struct {
			name string
			on   bool
		}{"vdpbf16ps", true})
	} else {
		t.Logf("no VDPBF16PS here: only the fallback is tested")
	}
	return cs
}

// roundedX returns x rounded to bf16 (BF16Bits) as float32.
func roundedX(x []float32) []float32 {
	xr := make([]float32, len(x))
	for i, v := range x {
		xr[i] = BF16ToFloat32(BF16Bits(v))
	}
	return xr
}

// TestGemmBF16Dot compares GemmBF16Dot and GemmBF16DotAcc on both paths
// with the float64 reference on the bf16-rounded x over M = 1..9, 13, 33
// (every x tile and leftover, and blocks swept by several x tiles), N not
// multiples of 4, K with and without a tail (70) and the model's 384 and
// 1024, and shapes that split over the pool. Tolerance: 1e-5 of Σ|x·w|
// (+|y|): VDPBF16PS adds each pair's two exact products into the float32
// lane in turn, another summation order than GemmBF16's, with error of the
// order of √k·2⁻²⁴ relative to that sum.
func TestGemmBF16Dot(t *testing.T) {
	ms := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 33}
	ns := []int{1, 3, 4, 5, 8, 17, 100, 131}
	ks := []int{1, 31, 32, 33, 64, 70, 384, 1024}
	for _, c := range bf16DotCases(t) {
		t.Run(c.name, func(t *testing.T) {
			defer setBF16DotAsm(c.on)()
			if HasBF16Dot() != c.on {
				t.Fatalf("HasBF16Dot() = %v after setBF16DotAsm(%v)", HasBF16Dot(), c.on)
			}
			r := rand.New(rand.NewPCG(7, 8))
			for _, m := range ms {
				for _, n := range ns {
					for _, k := range ks {
						for _, acc := range []bool{false, true} {
							checkBF16DotCase(t, r, m, n, k, acc)
						}
					}
				}
			}
		})
	}
}

func checkBF16DotCase(t *testing.T, r *rand.Rand, m, n, k int, acc bool) {
	t.Helper()
	x := randSlice(r, m*k)
	xr := roundedX(x)
	w := randBF16(r, n*k)
	y0 := randSlice(r, m*n)
	want := append([]float32(nil), y0...)
	gemmBF16Ref(m, n, k, xr, w, want, acc)
	got := append([]float32(nil), y0...)
	if acc {
		GemmBF16DotAcc(m, n, k, x, w, got)
	} else {
		GemmBF16Dot(m, n, k, x, w, got)
	}
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var scale float64
			for p := 0; p < k; p++ {
				scale += math.Abs(float64(xr[i*k+p]) * float64(BF16ToFloat32(w[j*k+p])))
			}
			if acc {
				scale += math.Abs(float64(y0[i*n+j]))
			}
			tol := 1e-5*scale + 1e-30
			if d := math.Abs(float64(got[i*n+j] - want[i*n+j])); d > tol {
				t.Fatalf("m=%d n=%d k=%d acc=%v: y[%d,%d]=%g, want %g (|Δ|=%g > %g)",
					m, n, k, acc, i, j, got[i*n+j], want[i*n+j], d, tol)
			}
		}
	}
}

// TestGemmBF16DotRounds: GemmBF16Dot really rounds x. On an x that is not
// bf16-exact its result differs from GemmBF16 on the unrounded x, but by
// no more than the rounding can move it: Σ|x − bf16(x)|·|w| plus the
// float32 summation tolerance of both (1e-5 of Σ|x·w|).
func TestGemmBF16DotRounds(t *testing.T) {
	const m, n, k = 5, 67, 384
	for _, c := range bf16DotCases(t) {
		t.Run(c.name, func(t *testing.T) {
			defer setBF16DotAsm(c.on)()
			r := rand.New(rand.NewPCG(9, 10))
			x := randSlice(r, m*k)
			xr := roundedX(x)
			w := randBF16(r, n*k)
			got, full := make([]float32, m*n), make([]float32, m*n)
			GemmBF16Dot(m, n, k, x, w, got)
			GemmBF16(m, n, k, x, w, full)
			var maxD float64
			for i := 0; i < m; i++ {
				for j := 0; j < n; j++ {
					var bound, scale float64
					for p := 0; p < k; p++ {
						wv := math.Abs(float64(BF16ToFloat32(w[j*k+p])))
						bound += math.Abs(float64(x[i*k+p])-float64(xr[i*k+p])) * wv
						scale += math.Abs(float64(x[i*k+p])) * wv
					}
					d := math.Abs(float64(got[i*n+j] - full[i*n+j]))
					if d > bound+1e-5*scale {
						t.Fatalf("y[%d,%d]: |Δ| vs unrounded x %g > bound %g + %g", i, j, d, bound, 1e-5*scale)
					}
					maxD = max(maxD, d)
				}
			}
			if maxD == 0 {
				t.Fatal("GemmBF16Dot equals GemmBF16 on the unrounded x: x was not rounded")
			}
			t.Logf("max |Δ| vs GemmBF16 on the unrounded x: %.3g", maxD)
		})
	}
}

// TestRoundX: roundX gives BF16Bits's bits for every normal float (ties
// to even included, both signs, near overflow, ±Inf), NaN for NaN, at
// every position of rows with and without a k tail, and zero padding
// over stale scratch. Subnormals round to zero or to BF16Bits's value
// (VCVTNEPS2BF16 flushes them; VDPBF16PS would take them as zero anyway).
func TestRoundX(t *testing.T) {
	special := []float32{
		math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000), // ties
		math.Float32frombits(0xbf808000), math.Float32frombits(0x3f808001),
		math.Float32frombits(0x3f807fff), math.MaxFloat32, -math.MaxFloat32,
		posInf, negInf, 0, float32(math.Copysign(0, -1)), 1e-38, 1.5e-38,
	}
	for _, on := range []bool{false, true} {
		restore := setBF16DotAsm(on)
		r := rand.New(rand.NewPCG(11, 12))
		for _, k := range []int{1, 31, 32, 33, 64, 70, 384} {
			for _, m := range []int{1, 3} {
				x := randSlice(r, m*k)
				for i := range x {
					switch r.IntN(4) {
					case 0:
						x[i] = special[r.IntN(len(special))]
					case 1:
						x[i] = math.Float32frombits(r.Uint32()) // any bits
					}
				}
				x[r.IntN(len(x))] = nan32
				sub := r.IntN(len(x))
				x[sub] = math.Float32frombits(0x00012345) // subnormal
				kp := (k + 31) &^ 31
				xs := make([]uint16, m*kp)
				for i := range xs {
					xs[i] = 0x7777
				}
				roundX(m, k, x, xs)
				for i := 0; i < m; i++ {
					for p := 0; p < kp; p++ {
						got := xs[i*kp+p]
						if p >= k {
							if got != 0 {
								t.Fatalf("asm=%v m=%d k=%d: padding xs[%d,%d] = %#x", on, m, k, i, p, got)
							}
							continue
						}
						v := x[i*k+p]
						want := BF16Bits(v)
						switch f := BF16ToFloat32(got); {
						case v != v:
							if f == f {
								t.Fatalf("asm=%v k=%d: NaN rounded to %#x", on, k, got)
							}
						case i*k+p == sub || math.Abs(float64(v)) < 0x1p-126:
							if got != want && got&0x7fff != 0 {
								t.Fatalf("asm=%v k=%d: subnormal %g rounded to %#x, want %#x or zero", on, k, v, got, want)
							}
						case got != want:
							t.Fatalf("asm=%v m=%d k=%d: bf16(%g = %#x) = %#x, want %#x", on, m, k, v, math.Float32bits(v), got, want)
						}
					}
				}
			}
		}
		restore()
	}
}

// TestGemmBF16DotExported: the entry points' edge shapes (k = 0 clears or
// keeps y, m or n = 0 does nothing) and the shape check.
func TestGemmBF16DotExported(t *testing.T) {
	y := []float32{1, 2, 3, 4}
	GemmBF16DotAcc(2, 2, 0, nil, nil, y)
	if y[0] != 1 || y[3] != 4 {
		t.Fatalf("GemmBF16DotAcc with k=0 changed y: %v", y)
	}
	GemmBF16Dot(2, 2, 0, nil, nil, y)
	for _, v := range y {
		if v != 0 {
			t.Fatalf("GemmBF16Dot with k=0 left y = %v", y)
		}
	}
	GemmBF16Dot(0, 4, 4, nil, make([]uint16, 16), nil)
	GemmBF16Dot(4, 0, 4, make([]float32, 16), nil, nil)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a short w")
		}
	}()
	GemmBF16Dot(2, 3, 4, make([]float32, 8), make([]uint16, 11), make([]float32, 6))
}

// TestHasBF16Dot: on with the CPU feature, off after SetGEMMPath("go").
func TestHasBF16Dot(t *testing.T) {
	t.Logf("HasBF16Dot() = %v", HasBF16Dot())
	old := goForced
	goForced = true
	defer func() { goForced = old }()
	if HasBF16Dot() {
		t.Error("HasBF16Dot() with CHUNLIAN_GEMM=go")
	}
}

// BenchmarkGemmBF16Dot compares, in one run, GemmBF16 ("bf16") with
// GemmBF16Dot ("dot", rounding x included) at decode batch sizes.
// go test -run '^$' -bench GemmBF16Dot -benchtime 200x ./kernels/cpu
func BenchmarkGemmBF16Dot(b *testing.B) {
	for _, nk := range []struct{ n, k int }{{1152, 384}, {384, 1024}} {
		for _, m := range []int{1, 4, 16, 32} {
			r := rand.New(rand.NewPCG(1, 2))
			x := randSlice(r, m*nk.k)
			w := randBF16(r, nk.n*nk.k)
			y := make([]float32, m*nk.n)
			for _, v := range []struct {
				name string
				f    func(m, n, k int, x []float32, w []uint16, y []float32)
			}{{"bf16", GemmBF16}, {"dot", GemmBF16Dot}} {
				b.Run(fmt.Sprintf("%s/N=%d/K=%d/M=%d", v.name, nk.n, nk.k, m), func(b *testing.B) {
					v.f(m, nk.n, nk.k, x, w, y)
					for b.Loop() {
						v.f(m, nk.n, nk.k, x, w, y)
					}
					b.ReportMetric(2*float64(m*nk.n*nk.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}
