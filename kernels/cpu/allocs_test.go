package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The forward pass calls these kernels thousands of times per step; they must
// not allocate (the OpenBLAS path allows the one variadic-argument slice that
// purego.SyscallN needs).
func TestKernelsDoNotAllocate(t *testing.T) {
	old := Threads()
	defer SetThreads(old)
	SetThreads(2) // make the pool hand-off path run even on one core
	r := rand.New(rand.NewPCG(1, 2))
	for _, p := range availablePaths() {
		limit := 0.0
		if p == "openblas" {
			limit = 1
		}
		for _, m := range []int{1, 3, 64} {
			x, w, y := randSlice(r, m*512), randSlice(r, 512*512), make([]float32, m*512)
			t.Run(fmt.Sprintf("%s/m=%d", p, m), func(t *testing.T) {
				withPath(t, p, func() {
					if a := testing.AllocsPerRun(10, func() { Gemm(m, 512, 512, x, w, y) }); a > limit {
						t.Errorf("Gemm allocates %v times per call, want ≤ %v", a, limit)
					}
					if a := testing.AllocsPerRun(10, func() { GemmAcc(m, 512, 512, x, w, y) }); a > limit {
						t.Errorf("GemmAcc allocates %v times per call, want ≤ %v", a, limit)
					}
				})
			})
		}
	}
	x := randSlice(r, 256*512)
	wt := randSlice(r, 512)
	pos := make([]int32, 256)
	for i := range pos {
		pos[i] = int32(i)
	}
	offs := []int{0, 64, 7, 1000}
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"RMSNorm", func() { RMSNorm(x, x, wt, 256, 512, 1e-5) }},
		{"RoPE", func() { RoPE(x, pos, 256, 8, 64, 10000) }},
		{"SwiGLU", func() { SwiGLU(x[65536:98304], x[:65536], 32, 1024) }},
		{"Add", func() { Add(x[:512], x[512:1024]) }},
		{"Softmax", func() { Softmax(x[:512]) }},
		{"Dot", func() { _ = Dot(x[:512], x[512:1024]) }},
		{"Axpy", func() { Axpy(0.5, x[:512], x[512:1024]) }},
		{"DotsAt", func() { DotsAt(x[:64], x[1024:], offs, x[512:512+len(offs)]) }},
		{"AxpysAt", func() { AxpysAt(x[:len(offs)], x[1024:], offs, x[512:576]) }},
	} {
		if a := testing.AllocsPerRun(10, tc.f); a > 0 {
			t.Errorf("%s allocates %v times per call", tc.name, a)
		}
	}
}
