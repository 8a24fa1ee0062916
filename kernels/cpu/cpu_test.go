package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// withPath runs f with GEMM path p forced, restoring the previous one.
func withPath(t testing.TB, p string, f func()) {
	old := Path()
	setPath(p)
	defer setPath(old)
	f()
}

// forEachElem runs f as a subtest once per elementwise implementation set
// usable on this machine (plain Go, and the assembly with AVX2+FMA).
func forEachElem(t *testing.T, f func(t *testing.T)) {
	for _, set := range elemSets {
		t.Run(set.name, func(t *testing.T) {
			old := elem
			elem = set
			defer func() { elem = old }()
			f(t)
		})
	}
}

// closeEnough compares with a tolerance scaled by the magnitude of the terms
// (scale), since float32 accumulation error grows with k·|x|·|w|.
func closeEnough(got, want, scale float64, rel float64) bool {
	return math.Abs(got-want) <= rel*scale+1e-6
}

var gemmShapes = []struct{ m, n, k int }{
	{1, 1, 1}, {1, 7, 3}, {1, 512, 384}, {1, 6001, 384}, {2, 3, 5},
	{3, 5, 17}, {4, 4, 4}, {5, 9, 33}, {7, 13, 1031}, {8, 1408, 512},
	{13, 100, 77}, {17, 33, 9}, {31, 65, 129}, {64, 512, 512},
	{129, 383, 257}, {300, 70, 1408}, {1, 3, 0}, {2, 8, 24}, {6, 12, 271}, {3, 4, 16},
}

func TestGemmPaths(t *testing.T) {
	for _, p := range availablePaths() {
		for _, threads := range []int{1, 3} {
			for _, sh := range gemmShapes {
				for _, acc := range []bool{false, true} {
					name := fmt.Sprintf("%s/t%d/%dx%dx%d/acc=%v", p, threads, sh.m, sh.n, sh.k, acc)
					t.Run(name, func(t *testing.T) {
						old := Threads()
						SetThreads(threads)
						defer SetThreads(old)
						r := rand.New(rand.NewPCG(uint64(sh.m*1000003+sh.n*1009+sh.k), 7))
						x := randSlice(r, sh.m*sh.k)
						w := randSlice(r, sh.n*sh.k)
						y0 := randSlice(r, sh.m*sh.n)
						want := append([]float32(nil), y0...)
						gemmRef(sh.m, sh.n, sh.k, x, w, want, acc)
						got := append([]float32(nil), y0...)
						withPath(t, p, func() {
							if acc {
								GemmAcc(sh.m, sh.n, sh.k, x, w, got)
							} else {
								Gemm(sh.m, sh.n, sh.k, x, w, got)
							}
						})
						scale := math.Sqrt(float64(sh.k)) + 1
						for i := range want {
							if !closeEnough(float64(got[i]), float64(want[i]), scale, 1e-5) {
								t.Fatalf("y[%d,%d] = %v, want %v", i/sh.n, i%sh.n, got[i], want[i])
							}
						}
					})
				}
			}
		}
	}
}

func TestGemmDoesNotTouchBeyondShape(t *testing.T) {
	for _, p := range availablePaths() {
		t.Run(p, func(t *testing.T) {
			m, n, k := 5, 11, 19
			r := rand.New(rand.NewPCG(1, 2))
			x, w := randSlice(r, m*k), randSlice(r, n*k)
			y := make([]float32, m*n+8)
			for i := m * n; i < len(y); i++ {
				y[i] = 42
			}
			withPath(t, p, func() { Gemm(m, n, k, x, w, y) })
			for i := m * n; i < len(y); i++ {
				if y[i] != 42 {
					t.Fatalf("y[%d] overwritten: %v", i, y[i])
				}
			}
		})
	}
}

func TestPickPath(t *testing.T) {
	all := []string{"openblas", "asm", "go"}
	for _, tc := range []struct {
		want  string
		avail []string
		got   string
	}{
		{"", all, "openblas"},
		{"", []string{"asm", "go"}, "asm"},
		{"", []string{"go"}, "go"},
		{"go", all, "go"},
		{"asm", all, "asm"},
		{"asm", []string{"openblas", "go"}, "go"},
		{"asm", []string{"go"}, "go"},
		{"openblas", all, "openblas"},
		{"openblas", []string{"asm", "go"}, "asm"},
		{"openblas", []string{"go"}, "go"},
		{"bogus", []string{"asm", "go"}, "asm"},
	} {
		if got := pickPath(tc.want, tc.avail); got != tc.got {
			t.Errorf("pickPath(%q, %v) = %q, want %q", tc.want, tc.avail, got, tc.got)
		}
	}
}

// TestSetGEMMPath: after SetGEMMPath, Path() names what runs: the path
// asked for where available (else the next slower one), with the assembly
// kernels (elementwise, bf16, int8) on "openblas" and "asm" where the CPU
// has them, plain Go on "go".
func TestSetGEMMPath(t *testing.T) {
	defer SetGEMMPath(Path())
	avail := availablePaths()
	for _, p := range []string{"openblas", "asm", "go"} {
		SetGEMMPath(p)
		want := p
		if !slices.Contains(avail, p) {
			want = pickPath(p, avail)
		}
		if Path() != want {
			t.Errorf("SetGEMMPath(%q): Path() = %q, want %q", p, Path(), want)
		}
		asm := want != "go" && bf16AsmAvailable()
		if got := elem.name != "go"; got != asm {
			t.Errorf("SetGEMMPath(%q): elementwise set %s, want assembly %v", p, elem.name, asm)
		}
		if HasFastBF16() != asm || HasFastInt8() != asm {
			t.Errorf("SetGEMMPath(%q): HasFastBF16() = %v, HasFastInt8() = %v, want %v", p, HasFastBF16(), HasFastInt8(), asm)
		}
	}
}

func TestPathEnvOrder(t *testing.T) {
	// Path() must be one of the available paths.
	p := Path()
	found := false
	for _, a := range availablePaths() {
		found = found || a == p
	}
	if !found {
		t.Fatalf("Path() = %q, not in available %v", p, availablePaths())
	}
}

func TestRMSNorm(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		for _, tc := range []struct{ rows, d int }{{1, 1}, {1, 7}, {3, 384}, {5, 513}, {200, 512}} {
			t.Run(fmt.Sprintf("%dx%d", tc.rows, tc.d), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(tc.rows), uint64(tc.d)))
				x := randSlice(r, tc.rows*tc.d)
				wt := randSlice(r, tc.d)
				const eps = 1e-5
				out := make([]float32, len(x))
				RMSNorm(out, x, wt, tc.rows, tc.d, eps)
				for row := 0; row < tc.rows; row++ {
					var ss float64
					for j := 0; j < tc.d; j++ {
						v := float64(x[row*tc.d+j])
						ss += v * v
					}
					inv := 1 / math.Sqrt(ss/float64(tc.d)+eps)
					for j := 0; j < tc.d; j++ {
						want := float64(x[row*tc.d+j]) * inv * float64(wt[j])
						if !closeEnough(float64(out[row*tc.d+j]), want, math.Abs(want), 1e-5) {
							t.Fatalf("out[%d,%d] = %v, want %v", row, j, out[row*tc.d+j], want)
						}
					}
				}
				// In place gives the same result.
				RMSNorm(x, x, wt, tc.rows, tc.d, eps)
				for i := range x {
					if x[i] != out[i] {
						t.Fatalf("in-place differs at %d: %v vs %v", i, x[i], out[i])
					}
				}
			})
		}
	})
}

func TestRoPE(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		for _, tc := range []struct {
			rows, heads, hd int
			theta           float64
		}{{1, 1, 2, 10000}, {3, 2, 8, 10000}, {4, 6, 64, 10000}, {2, 3, 48, 500000}, {700, 6, 64, 10000}} {
			t.Run(fmt.Sprintf("%dx%dx%d", tc.rows, tc.heads, tc.hd), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(tc.hd), 3))
				x := randSlice(r, tc.rows*tc.heads*tc.hd)
				pos := make([]int32, tc.rows)
				for i := range pos {
					pos[i] = int32(r.IntN(5000))
				}
				pos[0] = 0
				got := append([]float32(nil), x...)
				RoPE(got, pos, tc.rows, tc.heads, tc.hd, tc.theta)
				half := tc.hd / 2
				for row := 0; row < tc.rows; row++ {
					for h := 0; h < tc.heads; h++ {
						base := row*tc.heads*tc.hd + h*tc.hd
						for i := 0; i < half; i++ {
							ang := float64(pos[row]) * math.Pow(tc.theta, -2*float64(i)/float64(tc.hd))
							a, b := float64(x[base+i]), float64(x[base+i+half])
							wa := a*math.Cos(ang) - b*math.Sin(ang)
							wb := b*math.Cos(ang) + a*math.Sin(ang)
							// Angles up to 5000 rad in float32 lose ~3e-4 rad.
							if math.Abs(float64(got[base+i])-wa) > 2e-3 || math.Abs(float64(got[base+i+half])-wb) > 2e-3 {
								t.Fatalf("row %d head %d i %d: got (%v,%v) want (%v,%v)", row, h, i,
									got[base+i], got[base+i+half], wa, wb)
							}
						}
					}
				}
			})
		}
	})
}

// TestRoPEKernelsAgree: every implementation set rotates as ropeGo does,
// bit for bit, with and without a tail after the vector part.
func TestRoPEKernelsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 7, 8, 24, 32, 33} {
		a, b, c, s := randSlice(r, n), randSlice(r, n), randSlice(r, n), randSlice(r, n)
		wa, wb := slices.Clone(a), slices.Clone(b)
		ropeGo(wa, wb, c, s)
		for _, set := range elemSets {
			ga, gb := slices.Clone(a), slices.Clone(b)
			set.rope(ga, gb, c, s)
			for i := range n {
				if !sameBits(ga[i], wa[i]) || !sameBits(gb[i], wb[i]) {
					t.Fatalf("%s n=%d i=%d: got (%v, %v), ropeGo (%v, %v)", set.name, n, i, ga[i], gb[i], wa[i], wb[i])
				}
			}
		}
	}
}

// TestRoPEStrided: rotating the first heads of wider rows in place gives,
// bit for bit, RoPE of those heads packed, and leaves the rest of each row
// (the v heads of a q|k|v row) untouched, on one thread and on the pool.
func TestRoPEStrided(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		for _, tc := range []struct{ rows, heads, extra, hd int }{{1, 2, 1, 8}, {5, 3, 2, 16}, {700, 12, 6, 64}} {
			r := rand.New(rand.NewPCG(uint64(tc.rows), 9))
			stride := (tc.heads + tc.extra) * tc.hd
			x := randSlice(r, tc.rows*stride)
			pos := make([]int32, tc.rows)
			for i := range pos {
				pos[i] = int32(r.IntN(200))
			}
			packed := make([]float32, tc.rows*tc.heads*tc.hd)
			for row := range tc.rows {
				copy(packed[row*tc.heads*tc.hd:(row+1)*tc.heads*tc.hd], x[row*stride:])
			}
			RoPE(packed, pos, tc.rows, tc.heads, tc.hd, 10000)
			got := append([]float32(nil), x...)
			RoPEStrided(got, stride, pos, tc.rows, tc.heads, tc.hd, 10000)
			for row := range tc.rows {
				for i := range stride {
					want := x[row*stride+i]
					if i < tc.heads*tc.hd {
						want = packed[row*tc.heads*tc.hd+i]
					}
					if got[row*stride+i] != want {
						t.Fatalf("%+v: row %d col %d = %v, want %v", tc, row, i, got[row*stride+i], want)
					}
				}
			}
		}
	})
}

func TestRoPEConcurrent(t *testing.T) {
	// Table growth under concurrent use must be race-free (run with -race).
	done := make(chan bool)
	for g := 0; g < 4; g++ {
		go func(g int) {
			x := make([]float32, 2*16)
			for i := range x {
				x[i] = 1
			}
			RoPE(x, []int32{int32(g * 3000), int32(g*3000 + 1)}, 2, 1, 16, 10000)
			done <- true
		}(g)
	}
	for g := 0; g < 4; g++ {
		<-done
	}
}

func TestElementwise(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		for _, n := range []int{0, 1, 7, 8, 9, 31, 64, 1000, 40000} {
			t.Run(fmt.Sprint(n), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(n), 5))
				a, b := randSlice(r, n), randSlice(r, n)

				var want float64
				for i := range a {
					want += float64(a[i]) * float64(b[i])
				}
				if got := Dot(a, b); !closeEnough(float64(got), want, math.Sqrt(float64(n))+1, 1e-5) {
					t.Errorf("Dot = %v, want %v", got, want)
				}

				y := append([]float32(nil), b...)
				Axpy(0.5, a, y)
				for i := range y {
					if w := b[i] + 0.5*a[i]; math.Abs(float64(y[i]-w)) > 1e-6 {
						t.Fatalf("Axpy[%d] = %v, want %v", i, y[i], w)
					}
				}

				d := append([]float32(nil), a...)
				Add(d, b)
				for i := range d {
					if d[i] != a[i]+b[i] {
						t.Fatalf("Add[%d] = %v, want %v", i, d[i], a[i]+b[i])
					}
				}

				out := make([]float32, n)
				elem.siluMul(out, a, b)
				for i := range out {
					g := float64(a[i])
					w := g / (1 + math.Exp(-g)) * float64(b[i])
					if !closeEnough(float64(out[i]), w, math.Abs(w), 1e-5) {
						t.Fatalf("siluMul[%d] = %v, want %v", i, out[i], w)
					}
				}

				s := append([]float32(nil), a...)
				for i := range s {
					s[i] *= 30 // large logits exercise the max subtraction
				}
				orig := append([]float32(nil), s...)
				Softmax(s)
				if n > 0 {
					mx := math.Inf(-1)
					for _, v := range orig {
						mx = math.Max(mx, float64(v))
					}
					var z float64
					for _, v := range orig {
						z += math.Exp(float64(v) - mx)
					}
					for i := range s {
						w := math.Exp(float64(orig[i])-mx) / z
						if !closeEnough(float64(s[i]), w, w, 1e-5) {
							t.Fatalf("Softmax[%d] = %v, want %v", i, s[i], w)
						}
					}
				}
			})
		}
	})
}

// TestSwiGLU: each output row is the elementwise set's siluMul of its gu
// row's two halves, bit for bit, on one thread and split over the pool
// (rows·f ≥ 2^15).
func TestSwiGLU(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		for _, sh := range []struct{ rows, f int }{{1, 7}, {3, 33}, {2, 1024}, {40, 1024}, {37, 1000}} {
			r := rand.New(rand.NewPCG(uint64(sh.rows), uint64(sh.f)))
			gu := randSlice(r, sh.rows*2*sh.f)
			out := randSlice(r, sh.rows*sh.f+1) // one float past the end stays
			last := out[len(out)-1]
			SwiGLU(out, gu, sh.rows, sh.f)
			want := make([]float32, sh.f)
			for row := 0; row < sh.rows; row++ {
				g := gu[row*2*sh.f : (row+1)*2*sh.f]
				elem.siluMul(want, g[:sh.f], g[sh.f:])
				for i, w := range want {
					if got := out[row*sh.f+i]; got != w {
						t.Fatalf("rows %d f %d: out[%d,%d] = %v, want %v", sh.rows, sh.f, row, i, got, w)
					}
				}
			}
			if out[len(out)-1] != last {
				t.Errorf("rows %d f %d: SwiGLU wrote past rows·f", sh.rows, sh.f)
			}
		}
	})
}

// TestDotsAtAxpysAt checks DotsAt and AxpysAt against float64 sums over
// head sizes around the assembly's block sizes and random, unaligned
// offsets, with NaN guards around base and y to catch reads and writes out
// of range. Under the assembly and plain-Go sets each result must also
// equal Dot, or Axpy called per offset, bit for bit.
func TestDotsAtAxpysAt(t *testing.T) {
	const guard = 40
	nan := float32(math.NaN())
	forEachElem(t, func(t *testing.T) {
		exact := elem.name == "go" || elem.name == "asm"
		for _, n := range []int{0, 1, 7, 8, 16, 24, 63, 64, 65, 96, 128, 200} {
			for _, cnt := range []int{0, 1, 3, 33} {
				t.Run(fmt.Sprintf("n=%d/cnt=%d", n, cnt), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(n), uint64(cnt)))
					L := 3*n + 5
					buf := randSlice(r, L+2*guard)
					for i := 0; i < guard; i++ {
						buf[i], buf[L+guard+i] = nan, nan
					}
					base := buf[guard : guard+L]
					offs := make([]int, cnt)
					for i := range offs {
						offs[i] = r.IntN(L - n + 1)
					}
					if cnt > 1 {
						offs[0], offs[1] = 0, L-n // both ends
					}
					q := randSlice(r, n)

					out := make([]float32, cnt)
					DotsAt(q, base, offs, out)
					for i, o := range offs {
						var want, mag float64
						for j := range q {
							p := float64(q[j]) * float64(base[o+j])
							want, mag = want+p, mag+math.Abs(p)
						}
						if !closeEnough(float64(out[i]), want, mag, 1e-5) {
							t.Fatalf("DotsAt[%d] = %v, want %v", i, out[i], want)
						}
						if d := Dot(q, base[o:]); exact && math.Float32bits(d) != math.Float32bits(out[i]) {
							t.Fatalf("DotsAt[%d] = %v, Dot gives %v", i, out[i], d)
						}
					}

					alpha := randSlice(r, cnt)
					ybuf := randSlice(r, n+2*guard)
					for i := 0; i < guard; i++ {
						ybuf[i], ybuf[n+guard+i] = nan, nan
					}
					y := ybuf[guard : guard+n]
					y0 := append([]float32(nil), y...)
					AxpysAt(alpha, base, offs, y)
					seq := append([]float32(nil), y0...)
					for i, o := range offs {
						Axpy(alpha[i], base[o:o+n], seq)
					}
					for j := range y {
						want, mag := float64(y0[j]), math.Abs(float64(y0[j]))
						for i, o := range offs {
							p := float64(alpha[i]) * float64(base[o+j])
							want, mag = want+p, mag+math.Abs(p)
						}
						if !closeEnough(float64(y[j]), want, mag, 1e-5) {
							t.Fatalf("AxpysAt: y[%d] = %v, want %v", j, y[j], want)
						}
						if exact && math.Float32bits(y[j]) != math.Float32bits(seq[j]) {
							t.Fatalf("AxpysAt: y[%d] = %v, Axpy per offset gives %v", j, y[j], seq[j])
						}
					}
					for i := 0; i < guard; i++ {
						if !math.IsNaN(float64(ybuf[i])) || !math.IsNaN(float64(ybuf[n+guard+i])) {
							t.Fatal("AxpysAt wrote outside y")
						}
					}
				})
			}
		}
	})
}

// TestDotsAtAxpysAtBadArgs: an offset that puts a vector outside base, or
// mismatched lengths, must panic before any kernel runs.
func TestDotsAtAxpysAtBadArgs(t *testing.T) {
	base, q := make([]float32, 100), make([]float32, 16)
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"DotsAt/negative", func() { DotsAt(q, base, []int{0, -1}, make([]float32, 2)) }},
		{"DotsAt/past end", func() { DotsAt(q, base, []int{85}, make([]float32, 1)) }},
		{"DotsAt/huge", func() { DotsAt(q, base, []int{math.MaxInt}, make([]float32, 1)) }},
		{"DotsAt/short base", func() { DotsAt(make([]float32, 101), base, []int{0}, make([]float32, 1)) }},
		{"DotsAt/short out", func() { DotsAt(q, base, []int{0, 1}, make([]float32, 1)) }},
		{"AxpysAt/negative", func() { AxpysAt([]float32{1}, base, []int{-16}, q) }},
		{"AxpysAt/past end", func() { AxpysAt([]float32{1, 1}, base, []int{84, 85}, q) }},
		{"AxpysAt/short alpha", func() { AxpysAt([]float32{1}, base, []int{0, 1}, q) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tc.f()
		})
	}
	// The last valid offset does not panic.
	DotsAt(q, base, []int{84}, make([]float32, 1))
	AxpysAt([]float32{1}, base, []int{84}, q)
}

func TestSoftmaxExtremes(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		x := []float32{float32(math.Inf(-1)), 1e30, -1e30, 0}
		Softmax(x)
		want := []float32{0, 1, 0, 0}
		for i := range x {
			if x[i] != want[i] {
				t.Fatalf("Softmax = %v, want %v", x, want)
			}
		}
	})
}

func TestSetThreads(t *testing.T) {
	old := Threads()
	defer SetThreads(old)
	for _, tc := range []struct{ set, want int }{{3, 3}, {1, 1}} {
		SetThreads(tc.set)
		if Threads() != tc.want {
			t.Errorf("SetThreads(%d): Threads() = %d", tc.set, Threads())
		}
	}
	SetThreads(0)
	if Threads() < 1 {
		t.Errorf("SetThreads(0): Threads() = %d", Threads())
	}
}

func TestReportPaths(t *testing.T) {
	// Informational: which paths this machine offers (not an assertion).
	t.Logf("available GEMM paths %v, in use %q, threads %d", availablePaths(), Path(), Threads())
}

func TestExpf(t *testing.T) {
	for _, x := range []float32{0, 1, -1, 0.5, -0.5, 10, -10, 30, -30, 80, -80, 88, -87, 0.3465736, -0.3465736, 1e-8} {
		want := math.Exp(float64(x))
		if got := float64(expf(x)); math.Abs(got-want) > 3e-7*want {
			t.Errorf("expf(%v) = %v, want %v (rel err %.2g)", x, got, want, math.Abs(got-want)/want)
		}
	}
	r := rand.New(rand.NewPCG(9, 9))
	for range 100000 {
		x := float32(r.Float64()*170 - 85)
		want := math.Exp(float64(x))
		if got := float64(expf(x)); math.Abs(got-want) > 3e-7*want {
			t.Fatalf("expf(%v) = %v, want %v (rel err %.2g)", x, got, want, math.Abs(got-want)/want)
		}
	}
	for _, tc := range []struct{ x, want float32 }{
		{float32(math.Inf(-1)), 0}, {-100, 0}, {100, float32(math.Inf(1))}, {float32(math.Inf(1)), float32(math.Inf(1))},
	} {
		if got := expf(tc.x); got != tc.want {
			t.Errorf("expf(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
	if got := expf(float32(math.NaN())); got == got {
		t.Errorf("expf(NaN) = %v, want NaN", got)
	}
}

// Kernels may be called from several goroutines at once (the engine loop,
// the sampler, tests running in parallel): parallel calls are serialised on
// the pool and every result must still be right. Run with -race.
func TestConcurrentCallers(t *testing.T) {
	old := Threads()
	SetThreads(2)
	defer SetThreads(old)
	const m, n, k = 9, 200, 130
	r := rand.New(rand.NewPCG(5, 6))
	x, w := randSlice(r, m*k), randSlice(r, n*k)
	want := make([]float32, m*n)
	gemmRef(m, n, k, x, w, want, false)
	rows := randSlice(r, 300*256)
	wt := randSlice(r, 256)
	wantNorm := make([]float32, len(rows))
	RMSNorm(wantNorm, rows, wt, 300, 256, 1e-6)

	errs := make(chan string, 8)
	done := make(chan bool)
	for g := 0; g < 4; g++ {
		go func() {
			defer func() { done <- true }()
			y := make([]float32, m*n)
			out := make([]float32, len(rows))
			for range 20 {
				Gemm(m, n, k, x, w, y)
				for i := range y {
					if !closeEnough(float64(y[i]), float64(want[i]), math.Sqrt(k)+1, 1e-5) {
						errs <- fmt.Sprintf("Gemm y[%d] = %v, want %v", i, y[i], want[i])
						return
					}
				}
				RMSNorm(out, rows, wt, 300, 256, 1e-6)
				for i := range out {
					if out[i] != wantNorm[i] {
						errs <- fmt.Sprintf("RMSNorm out[%d] = %v, want %v", i, out[i], wantNorm[i])
						return
					}
				}
			}
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
