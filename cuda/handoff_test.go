package cuda

import (
	"errors"
	"runtime"
	"testing"
	"time"
)

// TestHandoff runs closures through the worker hand-off (no GPU needed)
// with polling on, off and very short, checks each result reaches its
// caller, that every closure runs on the same locked OS thread's goroutine
// in order, and that closing the channel ends the worker.
func TestHandoff(t *testing.T) {
	for _, spin := range []time.Duration{-1, time.Nanosecond, 0, 2 * time.Millisecond} {
		b := &Backend{cmd: make(chan func(), 1), spin: handoffSpin(spin)}
		exited := make(chan struct{})
		go func() { b.worker(); close(exited) }()
		var order []int // touched only on the worker
		for i := 0; i < 200; i++ {
			want := errors.New("e")
			if i%2 == 0 {
				want = nil
			}
			if i%50 == 0 {
				time.Sleep(b.spin + time.Millisecond) // let the worker park
			}
			got := b.do(func() error {
				order = append(order, i)
				runtime.Gosched()
				return want
			})
			if got != want {
				t.Fatalf("spin %v call %d: got %v, want %v", spin, i, got, want)
			}
		}
		var n int
		_ = b.do(func() error { n = len(order); return nil })
		for i := 0; i < n; i++ {
			if order[i] != i {
				t.Fatalf("spin %v: closure %d ran as %d", spin, i, order[i])
			}
		}
		if n != 200 {
			t.Fatalf("spin %v: %d closures ran, want 200", spin, n)
		}
		close(b.cmd)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			t.Fatalf("spin %v: worker did not exit after close", spin)
		}
	}
	if handoffSpin(0) != DefaultHandoffSpin || handoffSpin(-5) != 0 || handoffSpin(time.Second) != time.Second {
		t.Error("handoffSpin defaults")
	}
}
