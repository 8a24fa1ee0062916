package main

import (
	"io"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"testing"
)

func TestSetMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Setenv("GOMEMLIMIT", "")

	setMemoryLimit(log, 3<<30)
	if got := debug.SetMemoryLimit(-1); got != 3<<30 {
		t.Errorf("explicit limit: %d, want %d", got, int64(3<<30))
	}

	keep := make([]byte, 64<<20) // live heap the limit must cover
	setMemoryLimit(log, 0)
	got := debug.SetMemoryLimit(-1)
	if got < int64(len(keep))+memLimitHeadroom || got == math.MaxInt64 {
		t.Errorf("automatic limit %d, want ≥ the 64 MiB kept live + %d", got, memLimitHeadroom)
	}
	runtime.KeepAlive(keep)

	debug.SetMemoryLimit(7 << 30)
	t.Setenv("GOMEMLIMIT", "7GiB")
	setMemoryLimit(log, 0)
	if got := debug.SetMemoryLimit(-1); got != 7<<30 {
		t.Errorf("with GOMEMLIMIT set the limit changed to %d", got)
	}
}
