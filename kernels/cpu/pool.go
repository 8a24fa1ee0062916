package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// The worker pool: a fixed set of goroutines that run parts of one parallel
// call. Starting goroutines per call costs a few µs each, and waking a
// parked goroutine (channel send, futex) can cost as long as a whole
// decode-time GEMM on a small VM. So a worker that finishes a part
// keeps polling for the next one for up to poolSpin (calling
// runtime.Gosched every 64 polls, so that goroutines waiting for its P
// still run) and only then parks on its channel: the GEMMs of one forward
// pass follow each other a few µs apart and find the worker awake; between
// steps it parks and costs nothing. Figures: docs/DECISIONS.md, "kernel
// pool hand-off".
//
// Invariants:
//   - poolMu is held for the whole of a parallel call: it serialises parallel
//     kernels (the engine drives one forward pass at a time, so contention is
//     rare, and two concurrent calls would only fight over the same cores)
//     and it guards the package-level job descriptors (theGemmJob, ...)
//     that callers fill before runParts, so that a parallel call allocates
//     nothing.
//   - The calling goroutine always executes part 0 itself; worker w executes
//     part w+1. A call with one part never touches the pool.
//   - Kernels never nest parallel calls (a job's run must not call
//     runParts), since poolMu is not reentrant.
//   - Hand-off of a part to worker w: the caller (holding poolMu) writes
//     w.item, then moves w.state to wPosted (a CAS from wSpinning, or, when
//     the CAS fails because the worker parked, a store followed by a send on
//     w.wake, which has capacity 1 and so never blocks). The worker takes
//     the item by a CAS of the state from wPosted back to wSpinning, runs
//     the part and decrements pending. Once the caller has run its own
//     part it takes back, by the same CAS, every item still posted (the
//     worker has not started: it would finish later than the caller can)
//     and runs it itself, decrementing pending for it; exactly one CAS
//     succeeds, so each item runs once. The caller polls pending down to 0
//     before returning (and so before posting again), so w.item is never
//     overwritten unread. A wake token left by a taken-back item only
//     makes the parked worker poll once more.
//   - With poolChunks > 1 an item (part −1) means "claim chunks from
//     nextChunk until none is left" (runChunks), and the caller does the
//     same: the parts adapt to a worker that starts late or runs slower,
//     and a taken-back item has nothing left to run.

var (
	threads atomic.Int32 // configured thread count (≥1)

	poolMu  sync.Mutex    // see above
	workers []*poolWorker // grown on demand, never shrunk; guarded by poolMu
	pending atomic.Int32  // parts of the current call not yet finished by workers
)

// The spin policy. poolSpin is how long an idle worker polls for a next
// part before it parks: long enough to span the gaps between the GEMMs of
// a decode step (attention, norms: a few to ~30 µs) and the engine's host
// work between two steps (sampling, scheduling: ~0.35 ms at 10 users on 2
// cores), so that a busy server's workers never park; a parked worker
// woken on a busy 2-core machine often starts too late to help, and the
// caller runs its part alone. poolYield is the number of polls
// between runtime.Gosched calls (worker and caller). poolChunks > 1 splits
// a call of parts parts into parts·poolChunks chunks that the caller and
// the workers claim as they go (runChunks) instead of one fixed part each;
// poolSteal lets the caller take back items that no worker has started
// (runParts).
//
// Chunks (4 per part) and steal-back are the defaults because they served
// the most couplets end to end, with attention on the pool too (Parallel);
// shorter spins, PAUSE-based polling and parking between forward passes
// were no better (docs/DECISIONS.md, "Kernel pool hand-off").
var (
	poolSpin   = time.Millisecond // read by the workers: set only at init
	poolYield  = 64               // ditto
	poolChunks = 4                // read by callers under poolMu
	poolSteal  = true             // ditto

	nextChunk atomic.Int32 // next chunk to claim (chunked calls); reset under poolMu
)

// Worker states (poolWorker.state).
const (
	wSpinning int32 = iota // polling for a part
	wPosted                // a part is in item, not yet taken
	wParked                // blocked on wake
)

type poolWorker struct {
	state atomic.Int32
	item  workItem      // written by the caller before state → wPosted
	wake  chan struct{} // capacity 1; a send wakes the parked worker
}

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

// loop is worker w's goroutine: forever, wait for a part (poll, then park)
// and run it.
func (w *poolWorker) loop() {
	for {
		var t0 time.Time
		for polls := 1; ; polls++ {
			// Take a posted item with a CAS: the caller may take it back
			// (runParts) with the same transition.
			if w.state.Load() == wPosted && w.state.CompareAndSwap(wPosted, wSpinning) {
				break
			}
			if polls%poolYield != 0 {
				continue
			}
			if t0.IsZero() {
				t0 = time.Now()
			} else if time.Since(t0) > poolSpin {
				if w.state.CompareAndSwap(wSpinning, wParked) {
					<-w.wake // the poster stored wPosted before sending
				}
				t0 = time.Time{}
				continue
			}
			runtime.Gosched()
		}
		it := w.item
		w.item = workItem{} // do not keep the caller's job alive
		if it.part < 0 {
			runChunks(it.j, it.parts)
		} else {
			it.j.run(it.part, it.parts)
		}
		pending.Add(-1)
	}
}

// runChunks claims chunks of j (of chunks in all) from nextChunk and runs
// them until none is left.
func runChunks(j job, chunks int) {
	for {
		c := int(nextChunk.Add(1)) - 1
		if c >= chunks {
			return
		}
		j.run(c, chunks)
	}
}

// post hands it to w (see the invariants above).
func (w *poolWorker) post(it workItem) {
	w.item = it
	if w.state.CompareAndSwap(wSpinning, wPosted) {
		return
	}
	w.state.Store(wPosted) // it was parked
	w.wake <- struct{}{}
}

// runParts runs j.run(p, parts) for p in [0, parts) and returns when all are
// done. The caller must hold poolMu and parts must be ≥ 2.
func runParts(j job, parts int) { runPartsChunked(j, parts, poolChunks) }

// gemmChunks is the chunks per part for a GEMM of m x rows: poolChunks,
// except fixed parts (1) for m = 1, where chunks are slower (docs/DECISIONS.md,
// "Kernel pool hand-off"): a one-row GEMM streams its weights once, and
// cutting the stream into more pieces costs more than a late worker does
// there.
func gemmChunks(m int) int {
	if m <= 1 {
		return 1
	}
	return poolChunks
}

// runPartsChunked is runParts with parts·chunksPer chunks claimed
// dynamically when chunksPer > 1, else the static parts.
func runPartsChunked(j job, parts, chunksPer int) {
	for len(workers) < parts-1 {
		w := &poolWorker{wake: make(chan struct{}, 1)}
		workers = append(workers, w)
		go w.loop()
	}
	pending.Store(int32(parts - 1))
	if chunksPer > 1 {
		chunks := parts * chunksPer
		nextChunk.Store(0)
		for p := 1; p < parts; p++ {
			workers[p-1].post(workItem{j, -1, chunks})
		}
		runChunks(j, chunks)
	} else {
		for p := 1; p < parts; p++ {
			workers[p-1].post(workItem{j, p, parts})
		}
		j.run(0, parts)
	}
	// A worker that has not taken its item yet would finish it later than
	// we can (it has not started, and our part is done): take it back and
	// run it here (with chunks there is nothing left to run). Then poll
	// for the others, yielding the P now and then (a worker may be waiting
	// for it, e.g. with GOMAXPROCS=1).
	for p := 1; p < parts && poolSteal; p++ {
		w := workers[p-1]
		if w.state.Load() == wPosted && w.state.CompareAndSwap(wPosted, wSpinning) {
			it := w.item
			w.item = workItem{}
			if it.part >= 0 {
				j.run(it.part, it.parts)
			}
			pending.Add(-1)
		}
	}
	for polls := 1; pending.Load() != 0; polls++ {
		if polls%poolYield == 0 {
			runtime.Gosched()
		}
	}
}

// split returns the half-open range of part p when n items are divided into
// parts contiguous chunks whose starts are multiples of align (align ≥ 1).
func split(n, parts, p, align int) (lo, hi int) {
	blocks := (n + align - 1) / align
	lo = blocks * p / parts * align
	hi = blocks * (p + 1) / parts * align
	return min(lo, n), min(hi, n)
}

// Job is a caller's parallel task for Parallel: Run(part, parts) does part
// part of parts; each part runs exactly once, on one goroutine, and no
// two parts share a goroutine at the same time.
type Job interface{ Run(part, parts int) }

// Parallel runs j.Run(p, parts) for every p in [0, parts) on the kernel
// pool (the caller runs part 0, and any part a worker has not started by
// the time the caller is done) and returns when all are done. It holds
// the pool for the whole call, so j must not call Parallel or a pool-split
// kernel (Gemm, GemmBF16, RMSNorm, ... above their inline sizes); the row
// kernels on short vectors (Dot, Axpy, Softmax) are fine. It serialises
// with other parallel calls and allocates nothing. For the forward pass's
// attention: one set of spinning workers for the GEMMs and attention
// instead of two sets competing for the cores.
func Parallel(j Job, parts int) {
	if parts <= 1 {
		j.Run(0, 1)
		return
	}
	poolMu.Lock()
	theExtJob.j = j
	runPartsChunked(&theExtJob, parts, 1)
	theExtJob.j = nil
	poolMu.Unlock()
}

// extJob adapts a Job; theExtJob is guarded by poolMu.
type extJob struct{ j Job }

var theExtJob extJob

func (e *extJob) run(p, np int) { e.j.Run(p, np) }
