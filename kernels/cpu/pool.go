package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// The worker pool: a fixed set of goroutines that run parts of one parallel
// call. Starting goroutines per call costs a few µs each, which matters for
// the decode-time shapes (M=1, N≈512) where a whole GEMM takes ~10-50 µs.
//
// Invariants:
//   - poolMu is held for the whole of a parallel call: it serialises parallel
//     kernels (the engine drives one forward pass at a time, so contention is
//     rare, and two concurrent calls would only fight over the same cores)
//     and it guards the package-level job descriptors (gemmJobs, rmsJobs, ...)
//     that callers fill before runParts, so that a parallel call allocates
//     nothing.
//   - The calling goroutine always executes part 0 itself; worker w executes
//     part w+1. A call with one part never touches the pool.
//   - Kernels never nest parallel calls (a job's run must not call
//     runParts), since poolMu is not reentrant.

var (
	threads atomic.Int32 // configured thread count (≥1)

	poolMu  sync.Mutex      // see above
	workers []chan workItem // grown on demand, never shrunk; guarded by poolMu
	poolWG  sync.WaitGroup  // counts outstanding parts of the current call
)

// job is one parallel call: run(part, parts) does part `part` of `parts`.
type job interface{ run(part, parts int) }

type workItem struct {
	j           job
	part, parts int
}

func init() {
	threads.Store(int32(max(1, runtime.GOMAXPROCS(0))))
}

// SetThreads sets the number of threads used by the kernels (n<1 means
// runtime.GOMAXPROCS(0)). It also sets OpenBLAS's thread count when OpenBLAS
// is loaded. Safe to call at any time; calls in flight finish with the count
// they started with.
func SetThreads(n int) {
	if n < 1 {
		n = runtime.GOMAXPROCS(0)
	}
	threads.Store(int32(n))
	setBLASThreads(n)
}

// Threads reports the thread count in use.
func Threads() int { return int(threads.Load()) }

func workerLoop(ch chan workItem) {
	for it := range ch {
		it.j.run(it.part, it.parts)
		poolWG.Done()
	}
}

// runParts runs j.run(p, parts) for p in [0, parts) and returns when all are
// done. The caller must hold poolMu and parts must be ≥ 2.
func runParts(j job, parts int) {
	for len(workers) < parts-1 {
		ch := make(chan workItem, 1)
		workers = append(workers, ch)
		go workerLoop(ch)
	}
	poolWG.Add(parts - 1)
	for p := 1; p < parts; p++ {
		workers[p-1] <- workItem{j, p, parts}
	}
	j.run(0, parts)
	poolWG.Wait()
}

// split returns the half-open range of part p when n items are divided into
// parts contiguous chunks whose starts are multiples of align (align ≥ 1).
func split(n, parts, p, align int) (lo, hi int) {
	blocks := (n + align - 1) / align
	lo = blocks * p / parts * align
	hi = blocks * (p + 1) / parts * align
	return min(lo, n), min(hi, n)
}
