package cpu

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// processCPU returns the user+system CPU time of the whole process. The
// machine the benchmarks run on is shared, so wall-clock GFLOP/s depends on
// how much CPU other processes take; GFLOP per CPU-second of this process
// ("GFLOP/cpu-s") is much less sensitive to that and shows per-core
// efficiency (it includes OpenBLAS threads spinning while they wait).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The shipped model's shapes (weights/chunlian-base: d=384, ffn=1024,
// vocab 6294, 6 heads of 64) as (N, K) of y = x·Wᵀ.
var benchNK = []struct {
	name string
	n, k int
}{
	{"qkvo", 384, 384},
	{"gateup", 1024, 384},
	{"down", 384, 1024},
	{"lmhead", 6294, 384},
}

var benchM = []int{1, 8, 32, 128, 512}

// BenchmarkGemm reports GFLOP/s (2·M·N·K per op) for every available path.
// Run e.g. go test -run '^$' -bench Gemm -benchtime=200ms ./kernels/cpu
func BenchmarkGemm(b *testing.B) {
	for _, p := range availablePaths() {
		for _, nk := range benchNK {
			for _, m := range benchM {
				b.Run(fmt.Sprintf("%s/%s/M=%d/N=%d/K=%d", p, nk.name, m, nk.n, nk.k), func(b *testing.B) {
					r := rand.New(rand.NewPCG(1, 2))
					x := randSlice(r, m*nk.k)
					w := randSlice(r, nk.n*nk.k)
					y := make([]float32, m*nk.n)
					withPath(b, p, func() {
						Gemm(m, nk.n, nk.k, x, w, y) // warm up (loads OpenBLAS, pool)
						c0 := processCPU()
						for b.Loop() {
							Gemm(m, nk.n, nk.k, x, w, y)
						}
						flop := 2 * float64(m*nk.n*nk.k) * float64(b.N)
						b.ReportMetric(flop/b.Elapsed().Seconds()/1e9, "GFLOP/s")
						if c := (processCPU() - c0).Seconds(); c > 0 {
							b.ReportMetric(flop/c/1e9, "GFLOP/cpu-s")
						}
					})
				})
			}
		}
	}
}

func BenchmarkRMSNorm(b *testing.B) {
	for _, rows := range []int{1, 64, 512} {
		b.Run(fmt.Sprintf("rows=%d/d=384", rows), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x, w := randSlice(r, rows*384), randSlice(r, 384)
			out := make([]float32, len(x))
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				RMSNorm(out, x, w, rows, 384, 1e-5)
			}
		})
	}
}

// BenchmarkSwiGLU runs SwiGLU on every elementwise set (go, asm)
// in one run: one decode row of the shipped model (ffn 1024), ten rows
// (10 users), and a prefill chunk of 64 rows of 1408 (pool-split).
func BenchmarkSwiGLU(b *testing.B) {
	for _, set := range elemSets {
		for _, sh := range []struct{ rows, f int }{{1, 1024}, {10, 1024}, {64, 1408}} {
			b.Run(fmt.Sprintf("%s/%dx%d", set.name, sh.rows, sh.f), func(b *testing.B) {
				old := elem
				elem = set
				defer func() { elem = old }()
				r := rand.New(rand.NewPCG(1, 2))
				gu := randSlice(r, sh.rows*2*sh.f)
				out := make([]float32, sh.rows*sh.f)
				b.SetBytes(int64(4 * len(out)))
				for b.Loop() {
					SwiGLU(out, gu, sh.rows, sh.f)
				}
			})
		}
	}
}

func BenchmarkRoPE(b *testing.B) {
	for _, rows := range []int{1, 256} {
		b.Run(fmt.Sprint(rows), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x := randSlice(r, rows*8*64)
			pos := make([]int32, rows)
			for i := range pos {
				pos[i] = int32(i)
			}
			for b.Loop() {
				RoPE(x, pos, rows, 8, 64, 10000)
			}
		})
	}
}

func BenchmarkDot(b *testing.B) {
	for _, n := range []int{64, 512} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x, y := randSlice(r, n), randSlice(r, n)
			var s float32
			b.SetBytes(int64(8 * n))
			for b.Loop() {
				s += Dot(x, y)
			}
			_ = s
		})
	}
}

func BenchmarkAxpy(b *testing.B) {
	for _, n := range []int{64, 512} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x, y := randSlice(r, n), randSlice(r, n)
			b.SetBytes(int64(8 * n))
			for b.Loop() {
				Axpy(0.001, x, y)
			}
		})
	}
}

// BenchmarkDotsAtAxpysAt compares one attention row's work (a query
// against cnt cached keys of 64 floats, then the weighted sum of as many
// values) done by DotsAt and AxpysAt with the same done by a Dot and an
// Axpy per key ("loop").
func BenchmarkDotsAtAxpysAt(b *testing.B) {
	const hd, stride = 64, 384 // one KV head among six per token
	for _, cnt := range []int{32, 128} {
		r := rand.New(rand.NewPCG(1, 2))
		base := randSlice(r, cnt*stride)
		q, y, sc := randSlice(r, hd), make([]float32, hd), make([]float32, cnt)
		offs := make([]int, cnt)
		for i := range offs {
			offs[i] = i * stride
		}
		b.Run(fmt.Sprintf("cnt=%d/loop", cnt), func(b *testing.B) {
			for b.Loop() {
				for i, o := range offs {
					sc[i] = Dot(q, base[o:o+hd])
				}
				for i, o := range offs {
					Axpy(sc[i]*1e-3, base[o:o+hd], y)
				}
			}
		})
		b.Run(fmt.Sprintf("cnt=%d/batched", cnt), func(b *testing.B) {
			for b.Loop() {
				DotsAt(q, base, offs, sc)
				for i := range sc {
					sc[i] *= 1e-3
				}
				AxpysAt(sc, base, offs, y)
			}
		})
	}
}

func BenchmarkSoftmax(b *testing.B) {
	for _, n := range []int{64, 6000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x := randSlice(r, n)
			for b.Loop() {
				Softmax(x)
			}
		})
	}
}

// BenchmarkLayer runs the kernel sequence of one decoder layer (the shipped
// model: d=384, ffn=1024, 6 heads of 64) without attention, so GEMMs alternate with
// pool-run elementwise kernels as in the real forward pass; this is where
// OpenBLAS's spinning worker threads and the Go pool compete for cores.
func BenchmarkLayer(b *testing.B) {
	const d, F, H, hd = 384, 1024, 6, 64
	r := rand.New(rand.NewPCG(1, 2))
	wq, wk, wv, wo := randSlice(r, d*d), randSlice(r, d*d), randSlice(r, d*d), randSlice(r, d*d)
	wg, wu, wd := randSlice(r, F*d), randSlice(r, F*d), randSlice(r, d*F)
	norm := randSlice(r, d)
	for _, p := range availablePaths() {
		for _, m := range []int{1, 8, 64, 256} {
			b.Run(fmt.Sprintf("%s/M=%d", p, m), func(b *testing.B) {
				x, xn := randSlice(r, m*d), make([]float32, m*d)
				q, k, v := make([]float32, m*d), make([]float32, m*d), make([]float32, m*d)
				g, u := make([]float32, m*F), make([]float32, m*F)
				pos := make([]int32, m)
				withPath(b, p, func() {
					c0 := processCPU()
					for b.Loop() {
						RMSNorm(xn, x, norm, m, d, 1e-5)
						Gemm(m, d, d, xn, wq, q)
						Gemm(m, d, d, xn, wk, k)
						Gemm(m, d, d, xn, wv, v)
						RoPE(q, pos, m, H, hd, 10000)
						RoPE(k, pos, m, H, hd, 10000)
						GemmAcc(m, d, d, v, wo, x)
						RMSNorm(xn, x, norm, m, d, 1e-5)
						Gemm(m, F, d, xn, wg, g)
						Gemm(m, F, d, xn, wu, u)
						elem.siluMul(g, g, u)
						GemmAcc(m, d, F, g, wd, x)
						RMSNorm(x, x, norm, m, d, 1e-5) // keep x bounded
					}
					flop := 2 * float64(m) * float64(4*d*d+3*d*F) * float64(b.N)
					b.ReportMetric(flop/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					if c := (processCPU() - c0).Seconds(); c > 0 {
						b.ReportMetric(flop/c/1e9, "GFLOP/cpu-s")
					}
				})
			})
		}
	}
}
