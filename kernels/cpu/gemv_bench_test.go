package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// The decode-step GEMV shapes of the shipped model (d=384, ffn=1024,
// vocab 6294) as (N, K) of y = x·Wᵀ, with the projections fused as the
// forward pass fuses them.
var gemvNK = []struct {
	name string
	n, k int
}{
	{"qkv", 1152, 384},
	{"wo", 384, 384},
	{"gateup", 2048, 384},
	{"down", 384, 1024},
	{"head", 6294, 384},
}

// BenchmarkGEMV compares, in one run, every bf16 kernel (through
// runGemmBF16, so the pool split and the x permutation are included), the
// assembly int8 kernels (runGemmInt8) and Gemm on the same weights in float32 (the float32 path in
// use: OpenBLAS sgemv at M=1 where installed), at M = 1, 2, 4, 8, 16, 32 rows.
// "hot" reuses one weight matrix (it stays in cache); "stream" cycles
// through copies totalling ≥ 96 MiB of float32 so each op reads its
// weights from memory, as a decode step over a model bigger than the
// last-level cache does. GB/s counts weight bytes.
//
//	go test -run '^$' -bench GEMV -benchtime=300ms ./kernels/cpu
func BenchmarkGEMV(b *testing.B) {
	for _, mode := range []string{"hot", "stream"} {
		for _, nk := range gemvNK {
			copies := 1
			if mode == "stream" {
				copies = max(2, (96<<20)/(4*nk.n*nk.k))
			}
			r := rand.New(rand.NewPCG(1, 2))
			ws := make([][]uint16, copies)
			wfs := make([][]float32, copies)
			qs := make([][]int8, copies)
			ss := make([][]float32, copies)
			for c := range ws {
				ws[c] = randBF16(r, nk.n*nk.k)
				wfs[c] = make([]float32, nk.n*nk.k)
				for i, v := range ws[c] {
					wfs[c][i] = BF16ToFloat32(v)
				}
				qs[c], ss[c] = QuantizeInt8(nk.n, nk.k, wfs[c])
			}
			for _, m := range []int{1, 2, 4, 8, 16, 32} {
				x := randSlice(r, m*nk.k)
				y := make([]float32, m*nk.n)
				report := func(b *testing.B, wbytes int, cpu0 time.Duration) {
					s := b.Elapsed().Seconds()
					b.ReportMetric(float64(wbytes)*float64(b.N)/s/1e9, "GB/s")
					b.ReportMetric(s*1e6/float64(b.N), "µs/op")
					b.ReportMetric((processCPU()-cpu0).Seconds()*1e6/float64(b.N), "cpu-µs/op")
				}
				for _, c := range bf16Cases() {
					b.Run(fmt.Sprintf("%s/%s/M=%d/bf16-%s", mode, nk.name, m, c.name), func(b *testing.B) {
						defer c.set()()
						cpu0 := processCPU()
						i := 0
						for b.Loop() {
							runGemmBF16(m, nk.n, nk.k, x, ws[i%copies], y, false, testImpl)
							i++
						}
						report(b, 2*nk.n*nk.k, cpu0)
					})
				}
				for _, c := range int8Cases() {
					if c.name == "go" {
						continue
					}
					b.Run(fmt.Sprintf("%s/%s/M=%d/int8-%s", mode, nk.name, m, c.name), func(b *testing.B) {
						defer c.set()()
						cpu0 := processCPU()
						i := 0
						for b.Loop() {
							runGemmInt8(m, nk.n, nk.k, x, qs[i%copies], ss[i%copies], y, false, c.kern)
							i++
						}
						report(b, nk.n*nk.k, cpu0)
					})
				}
				b.Run(fmt.Sprintf("%s/%s/M=%d/fp32-%s", mode, nk.name, m, Path()), func(b *testing.B) {
					cpu0 := processCPU()
					i := 0
					for b.Loop() {
						Gemm(m, nk.n, nk.k, x, wfs[i%copies], y)
						i++
					}
					report(b, 4*nk.n*nk.k, cpu0)
				})
			}
		}
	}
}
