//go:build unix

package main

import (
	"syscall"
	"testing"
)

func TestMaxConnsForFDs(t *testing.T) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		t.Skip(err)
	}
	if got := maxConnsForFDs(int(r.Cur) + 1); got <= 0 || got > max(16, int(r.Cur)-fdReserve) {
		t.Errorf("limit %d open files, cap asked above it: %d, want below the limit minus %d", r.Cur, got, fdReserve)
	}
	if r.Cur > 2*fdReserve {
		// A cap well under the limit is kept as asked.
		if want := int(r.Cur) / 4; maxConnsForFDs(want) != want {
			t.Errorf("cap %d well under the open-file limit %d: got %d, want it kept", want, r.Cur, maxConnsForFDs(want))
		}
	}
}
