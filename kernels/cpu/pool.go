package cpu

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The worker pool: a fixed set of goroutines that run parts of one parallel
// call. Starting goroutines per call costs a few µs each, and waking a
// parked goroutine (channel send, futex) costs 10-50 µs on this 2-vCPU VM,
// as long as a whole decode-time GEMM. So a worker that finishes a part
// keeps polling for the next one for up to poolSpin (calling
// runtime.Gosched every 64 polls, so that goroutines waiting for its P
// still run) and only then parks on its channel: the GEMMs of one forward
// pass follow each other a few µs apart and find the worker awake; between
// steps it parks and costs nothing. Measured at M=1 (int8 weights, quiet
// machine): the LM head split in two took 95 µs with the channel hand-off
// and 28 µs with this one; see /work/notes/bench-kernels.md.
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
//     w.wake, which has capacity 1 and so never blocks). The worker, on
//     seeing wPosted, takes w.item, moves the state back to wSpinning, runs
//     the part and decrements pending. The caller polls pending down to 0
//     before returning (and so before posting again), so w.item is never
//     overwritten unread.

var (
	threads atomic.Int32 // configured thread count (≥1)

	poolMu  sync.Mutex    // see above
	workers []*poolWorker // grown on demand, never shrunk; guarded by poolMu
	pending atomic.Int32  // parts of the current call not yet finished by workers
)

// The spin policy. poolSpin is how long an idle worker polls for a next
// part before it parks: long enough to span the gaps between the GEMMs of
// a decode step (attention, norms: a few to ~30 µs), short enough that a
// worker idles only briefly after a step. poolYield is the number of polls
// between runtime.Gosched calls (worker and caller), poolPause the PAUSE
// instructions per poll (amd64; 0 = none), and poolHint makes workers spin
// only while a forward pass is in flight (InForward) and park at once
// otherwise. CHUNLIAN_POOL overrides them for experiments, e.g.
// CHUNLIAN_POOL=spin=50us,yield=64,pause=10,hint=1 (parsePoolEnv).
var (
	poolSpin  = 200 * time.Microsecond
	poolYield = 64
	poolPause = 0
	poolHint  = false

	forwardDepth atomic.Int32 // forward passes in flight (InForward)
)

// InForward tells the pool that a forward pass is in flight until the
// returned function is called (defer cpu.InForward()()). With the hint
// policy, workers spin for their next part only inside such a window.
// Calls may nest and come from several goroutines; nothing allocates.
func InForward() (done func()) {
	forwardDepth.Add(1)
	return endForward
}

func endForward() { forwardDepth.Add(-1) }

func init() { parsePoolEnv(os.Getenv("CHUNLIAN_POOL")) }

// parsePoolEnv sets the spin policy from a comma-separated list of
// key=value (spin=DURATION, yield=N, pause=N, hint=0|1); unknown keys and
// bad values are ignored.
func parsePoolEnv(v string) {
	for _, kv := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(kv), "=")
		switch k {
		case "spin":
			if d, err := time.ParseDuration(val); err == nil && d >= 0 {
				poolSpin = d
			}
		case "yield":
			if n, err := strconv.Atoi(val); err == nil && n >= 1 {
				poolYield = n
			}
		case "pause":
			if n, err := strconv.Atoi(val); err == nil && n >= 0 {
				poolPause = n
			}
		case "hint":
			poolHint = val == "1" || val == "true"
		}
	}
}

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
		for polls := 1; w.state.Load() != wPosted; polls++ {
			if poolPause > 0 {
				spinPause(poolPause)
			}
			idle := poolHint && forwardDepth.Load() == 0
			if polls%poolYield != 0 && !idle {
				continue
			}
			if t0.IsZero() && !idle {
				t0 = time.Now()
			} else if idle || time.Since(t0) > poolSpin {
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
		w.state.Store(wSpinning)
		it.j.run(it.part, it.parts)
		pending.Add(-1)
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
func runParts(j job, parts int) {
	for len(workers) < parts-1 {
		w := &poolWorker{wake: make(chan struct{}, 1)}
		workers = append(workers, w)
		go w.loop()
	}
	pending.Store(int32(parts - 1))
	for p := 1; p < parts; p++ {
		workers[p-1].post(workItem{j, p, parts})
	}
	j.run(0, parts)
	// The workers' parts are about as long as ours: poll, yielding the P
	// now and then (a worker may be waiting for it, e.g. with GOMAXPROCS=1).
	for polls := 1; pending.Load() != 0; polls++ {
		if poolPause > 0 {
			spinPause(poolPause)
		}
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
