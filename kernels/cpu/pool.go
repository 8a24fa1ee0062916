package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// The worker pool: a fixed set of goroutines that run parts of one parallel
// call. Starting goroutines per call costs a few µs each, which matters for
// the decode-time shapes (M=1, N≈512) where the whole GEMM takes ~10-50 µs.
//
// Invariants:
//   - parallelFor is safe to call from many goroutines at once; calls are
//     serialised by poolMu (the engine drives one forward pass at a time, so
//     contention is rare and serialising keeps the workers' CPU share sane).
//   - The calling goroutine always executes part 0 itself; workers execute
//     parts 1..n-1. So a pool of size 1 never hands off work.

var (
	threads atomic.Int32 // configured thread count (≥1)

	poolMu  sync.Mutex // serialises parallel calls and pool resizing
	workers []chan task
)

type task struct {
	fn    func(part, nparts int)
	part  int
	parts int
	wg    *sync.WaitGroup
}

func init() {
	threads.Store(int32(max(1, runtime.GOMAXPROCS(0))))
}

// SetThreads sets the number of threads used by the kernels (n<1 means
// runtime.GOMAXPROCS(0)). It also sets OpenBLAS's thread count when OpenBLAS
// is loaded.
func SetThreads(n int) {
	if n < 1 {
		n = runtime.GOMAXPROCS(0)
	}
	threads.Store(int32(n))
	setBLASThreads(n)
}

// Threads reports the thread count in use.
func Threads() int { return int(threads.Load()) }

func workerLoop(ch chan task) {
	for t := range ch {
		t.fn(t.part, t.parts)
		t.wg.Done()
	}
}

// parallelFor runs fn(p, parts) for p in [0, parts) with parts ≤ Threads(),
// returning when all are done. parts ≤ 1 runs inline.
func parallelFor(parts int, fn func(part, parts int)) {
	if parts <= 1 {
		fn(0, 1)
		return
	}
	poolMu.Lock()
	defer poolMu.Unlock()
	for len(workers) < parts-1 {
		ch := make(chan task, 1)
		workers = append(workers, ch)
		go workerLoop(ch)
	}
	var wg sync.WaitGroup
	wg.Add(parts - 1)
	for p := 1; p < parts; p++ {
		workers[p-1] <- task{fn: fn, part: p, parts: parts, wg: &wg}
	}
	fn(0, parts)
	wg.Wait()
}

// split returns the half-open range of part p when n items are divided into
// parts contiguous chunks whose starts are multiples of align (align ≥ 1).
func split(n, parts, p, align int) (lo, hi int) {
	blocks := (n + align - 1) / align
	lo = blocks * p / parts * align
	hi = blocks * (p + 1) / parts * align
	return min(lo, n), min(hi, n)
}
