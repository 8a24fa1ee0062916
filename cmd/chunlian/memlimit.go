package main

import (
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
)

// memLimitHeadroom is the floor of the heap growth allowed above the live
// heap of a loaded, warmed-up server (the figures behind it are in
// docs/DECISIONS.md: requests allocate little; the live heap is the
// weights and the KV cache).
const memLimitHeadroom = 256 << 20

// setMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) once
// the model is loaded and warmed up: live heap (weights + KV cache, which
// sit on the Go heap with the CPU backend) plus max(256 MiB, half of it).
// Without it the GC lets the heap grow to twice the live heap (GOGC=100),
// so the weights alone doubled RSS. explicit > 0 sets that limit instead;
// a GOMEMLIMIT in the environment (the runtime's own setting) wins over
// both. It is process-wide state, so it lives in cmd, not in a library.
func setMemoryLimit(log *slog.Logger, explicit int64) {
	if os.Getenv("GOMEMLIMIT") != "" {
		log.Info("memory limit from GOMEMLIMIT", "bytes", debug.SetMemoryLimit(-1))
		return
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	live := int64(ms.HeapAlloc)
	limit := explicit
	if limit <= 0 {
		limit = live + max(memLimitHeadroom, live/2)
	}
	debug.SetMemoryLimit(limit)
	log.Info("memory limit", "limit_mib", limit>>20, "live_heap_mib", live>>20)
}
