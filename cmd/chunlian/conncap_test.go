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
		t.Errorf("limit %d open files, default above it: cap %d, want below the limit minus %d", r.Cur, got, fdReserve)
	}
	if r.Cur > 2*fdReserve {
		if got := maxConnsForFDs(int(r.Cur) / 4); got != 0 {
			t.Errorf("default well under the open-file limit: cap %d, want 0 (the default)", got)
		}
	}
}
