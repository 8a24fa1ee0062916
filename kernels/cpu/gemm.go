package cpu

import (
	"fmt"
	"sync"
)

// GEMM path selection. The path is chosen once (lazily, on first use): the
// fastest available, unless SetGEMMPath (the command line's --cpu-gemm)
// chose another. A path names the float32 GEMM and whether the assembly
// kernels (bf16, int8, elementwise, sampling) run beside it: "openblas"
// (OpenBLAS, assembly on), "asm" (plain Go, assembly on) or "go" (plain
// Go everywhere).

type gemmFunc func(m, n, k int, x, w, y []float32, acc bool)

var (
	pathOnce sync.Once
	pathName string
	gemmImpl gemmFunc
)

// Path reports the GEMM path in use: "openblas", "asm" or "go".
func Path() string {
	pathOnce.Do(choosePath)
	return pathName
}

// availablePaths lists the GEMM paths usable in this process, fastest
// first: "openblas" where OpenBLAS loaded, "asm" where the assembly kernels
// run (amd64 with AVX2+FMA, which every one of them needs: see
// bf16AsmAvailable), and "go".
func availablePaths() []string {
	var ps []string
	if blasAvailable() {
		ps = append(ps, "openblas")
	}
	if bf16AsmAvailable() {
		ps = append(ps, "asm")
	}
	return append(ps, "go")
}

// goForced is whether SetGEMMPath set the path "go" (CI's pass without
// vector code, or no assembly usable here): it keeps the bf16, int8,
// elementwise and sampling kernels on plain Go. The path chosen without
// SetGEMMPath is "go" only where no assembly is usable, so it needs none.
var goForced bool

func choosePath() {
	setPathLocked(pickPath("", availablePaths()))
}

// SetGEMMPath selects the GEMM path: "openblas" (float32 GEMMs on
// OpenBLAS), "asm" (float32 GEMMs in plain Go; the default where OpenBLAS
// is missing) or "go" (float32 GEMMs and every other kernel, bf16, int8,
// elementwise and sampling, in plain Go). The first two run the assembly
// kernels beside the float32 GEMM. An unavailable path falls back to the
// next slower available one; "" or an unknown name = the fastest
// available. It is process-wide: the command line calls it once at
// start-up, tests from TestMain; not safe concurrently with running
// kernels.
func SetGEMMPath(name string) {
	pathOnce.Do(choosePath)
	setPathLocked(pickPath(name, availablePaths()))
	goForced = pathName == "go"
	elem = elemSets[len(elemSets)-1] // the fastest set usable here
	if goForced {
		elem = goElem
	}
}

// pathOrder is every GEMM path, fastest first.
var pathOrder = []string{"openblas", "asm", "go"}

// pickPath returns the path to use given the requested path want and
// the available paths avail (a subsequence of pathOrder that always ends in
// "go"): the fastest available one when want is empty or unknown, else want
// or, if that is unavailable, the next slower available one.
func pickPath(want string, avail []string) string {
	start := 0
	for i, o := range pathOrder {
		if o == want {
			start = i
		}
	}
	for _, o := range pathOrder[start:] {
		for _, a := range avail {
			if a == o {
				return o
			}
		}
	}
	return "go"
}

func setPathLocked(name string) {
	pathName = name
	switch name {
	case "openblas":
		gemmImpl = gemmBLAS
	case "asm":
		gemmImpl = gemmGo
	default:
		pathName = "go"
		gemmImpl = gemmGo
	}
}

// setPath forces a path (tests and benchmarks). Not safe concurrently with
// Gemm calls.
func setPath(name string) {
	pathOnce.Do(choosePath)
	setPathLocked(name)
}

func checkGemm(m, n, k int, x, w, y []float32) {
	if m < 0 || n < 0 || k < 0 || len(x) < m*k || len(w) < n*k || len(y) < m*n {
		panic(fmt.Sprintf("cpu.Gemm: bad shapes m=%d n=%d k=%d len(x)=%d len(w)=%d len(y)=%d",
			m, n, k, len(x), len(w), len(y)))
	}
}

// Gemm computes y[m,n] = x[m,k] · w[n,k]ᵀ, overwriting y. All row-major; w is
// in the Hugging Face [out,in] layout. y must not overlap x or w; only the
// first m·k, n·k and m·n elements are used. Safe for concurrent use (parallel
// calls take turns on the worker pool).
func Gemm(m, n, k int, x, w, y []float32) {
	checkGemm(m, n, k, x, w, y)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		clear(y[:m*n])
		return
	}
	pathOnce.Do(choosePath)
	gemmImpl(m, n, k, x, w, y, false)
}

// GemmAcc computes y[m,n] += x[m,k] · w[n,k]ᵀ (a projection with the residual
// add fused in).
func GemmAcc(m, n, k int, x, w, y []float32) {
	checkGemm(m, n, k, x, w, y)
	if m == 0 || n == 0 || k == 0 {
		return
	}
	pathOnce.Do(choosePath)
	gemmImpl(m, n, k, x, w, y, true)
}

// gemmRef is the obviously-correct reference (float64 accumulation), used by
// tests as ground truth.
func gemmRef(m, n, k int, x, w, y []float32, acc bool) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				s += float64(x[i*k+p]) * float64(w[j*k+p])
			}
			if acc {
				s += float64(y[i*n+j])
			}
			y[i*n+j] = float32(s)
		}
	}
}

// gemmParts decides how a GEMM is split over threads. It returns the number
// of parts and whether the split is over rows of y (M) rather than columns
// (N, i.e. weight rows). Columns are preferred: the threads then read
// disjoint parts of W, so W (the bulk of the memory traffic for small M)
// crosses the memory bus once; rows are used only when N is too narrow to
// give each thread ≥ 64 columns. Tiny products run inline because a hand-off
// costs about as much as ~30k flops.
func gemmParts(m, n, k int) (parts int, byM bool) {
	t := Threads()
	if t <= 1 || 2*m*n*k < 1<<16 {
		return 1, false
	}
	if n >= 64*t || m < 2*t {
		return min(t, max(1, n/16)), false
	}
	return t, true
}

// gemmKernel computes y[i0:i1, j0:j1] (row stride n) = x·wᵀ over all of k.
type gemmKernel func(i0, i1, j0, j1, n, k int, x, w, y []float32, acc bool)

// gemmJob is one parallel GEMM; the single instance theGemmJob is guarded by
// poolMu (see pool.go).
type gemmJob struct {
	m, n, k        int
	x, w, y        []float32
	acc, byM       bool
	alignM, alignN int
	kern           gemmKernel
}

var theGemmJob gemmJob

func (g *gemmJob) run(p, np int) {
	if g.byM {
		i0, i1 := split(g.m, np, p, g.alignM)
		if i0 < i1 {
			g.kern(i0, i1, 0, g.n, g.n, g.k, g.x, g.w, g.y, g.acc)
		}
		return
	}
	j0, j1 := split(g.n, np, p, g.alignN)
	if j0 < j1 {
		g.kern(0, g.m, j0, j1, g.n, g.k, g.x, g.w, g.y, g.acc)
	}
}

// runGemm splits the product across the pool and calls kern for each
// rectangle. alignM/alignN keep split points on microkernel boundaries.
func runGemm(m, n, k int, x, w, y []float32, acc bool, alignM, alignN int, kern gemmKernel) {
	parts, byM := gemmParts(m, n, k)
	if parts <= 1 {
		kern(0, m, 0, n, n, k, x, w, y, acc)
		return
	}
	poolMu.Lock()
	theGemmJob = gemmJob{m, n, k, x, w, y, acc, byM, alignM, alignN, kern}
	runPartsChunked(&theGemmJob, parts, gemmChunks(m))
	theGemmJob = gemmJob{} // do not keep the caller's buffers alive
	poolMu.Unlock()
}
