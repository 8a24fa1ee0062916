package cuda

import (
	"errors"
	"runtime"
	"time"
)

// Hand-off between callers and the CUDA worker.
//
// Every CUDA call runs on one goroutine locked to its OS thread (worker),
// because the context is current per thread. A caller (the engine
// goroutine, through Forward) sends a closure on b.cmd and waits for its
// result. With plain blocking channels each call costs two thread
// wake-ups — the worker's locked thread, then the caller's — of several µs
// each, against a whole single-sequence decode step of ~100 µs on the GPU.
// So both sides first poll for up to b.spin: the worker for the next
// closure after finishing one (the engine's host work between two steps
// is usually shorter), the caller for its result (a small step's GPU time
// is usually shorter). Only then do they park on the channel. b.cmd has
// capacity 1 so that a send never waits for the polling worker to
// receive; callers are serialised by Backend.mu (New's calls come before
// the Backend is shared), so at most one closure is ever queued.

// DefaultHandoffSpin is Options.HandoffSpin's default: long enough to
// cover a small decode step and the engine's work between steps, short
// enough that an idle backend stops burning a core within milliseconds.
// LaunchDraw returns before the GPU work is done (async.go), so at low
// load the worker waits for the next closure longer than a shorter spin
// would cover and would park on every step. The spinning worker holds a
// core: a server run for peak throughput (well over a thousand concurrent
// users) does better with a shorter spin. Figures: docs/DECISIONS.md,
// "GPU hand-off spin".
const DefaultHandoffSpin = 2 * time.Millisecond

func handoffSpin(o time.Duration) time.Duration {
	switch {
	case o == 0:
		return DefaultHandoffSpin
	case o < 0:
		return 0
	}
	return o
}

// worker is the CUDA thread: it never unlocks, so the context stays current
// on this OS thread for the Backend's whole life. It returns when b.cmd is
// closed.
func (b *Backend) worker() {
	runtime.LockOSThread()
	for {
		f, ok := b.next()
		if !ok {
			return
		}
		f()
	}
}

// next returns the next closure (polling for up to b.spin first), or
// false once b.cmd is closed.
func (b *Backend) next() (func(), bool) {
	if b.spin > 0 {
		t0 := time.Now()
		for {
			select {
			case f, ok := <-b.cmd:
				return f, ok
			default:
			}
			if time.Since(t0) > b.spin {
				break
			}
		}
	}
	f, ok := <-b.cmd
	return f, ok
}

// errClosed is what every call on a closed Backend returns.
var errClosed = errors.New("cuda: backend closed")

// lockOpen takes mu for a call on an open backend. On error (closed) mu
// is not held; otherwise the caller unlocks it.
func (b *Backend) lockOpen() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return errClosed
	}
	return nil
}

// lockCall is lockOpen for the calls that report errors kept from the
// worker (deferredErr) before doing anything: on either error mu is not
// held.
func (b *Backend) lockCall() error {
	if err := b.lockOpen(); err != nil {
		return err
	}
	if err := b.deferredErr(); err != nil {
		b.mu.Unlock()
		return err
	}
	return nil
}

// syncCall runs f on the worker for a synchronous call (Forward,
// ForwardDraw): lockCall, then do.
func (b *Backend) syncCall(f func() error) error {
	if err := b.lockCall(); err != nil {
		return err
	}
	defer b.mu.Unlock()
	return b.do(f)
}

// do runs f on the worker and returns its error.
func (b *Backend) do(f func() error) error {
	done := make(chan error, 1)
	b.cmd <- func() { done <- f() }
	return spinRecv(b.spin, done)
}

// spinRecv receives from ch, polling for up to spin before it parks (the
// caller's side of the hand-off: a result that comes within spin costs no
// thread wake-up).
func spinRecv[T any](spin time.Duration, ch <-chan T) T {
	if spin > 0 {
		t0 := time.Now()
		for {
			select {
			case v := <-ch:
				return v
			default:
			}
			if time.Since(t0) > spin {
				break
			}
		}
	}
	return <-ch
}
