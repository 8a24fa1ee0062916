//go:build unix

package sampler

import (
	"syscall"
	"time"
)

// cpuTime is the process's user + system CPU time so far (all threads).
// Benchmarks report CPU per unit of work next to wall time: on a shared
// machine the wall time of a run depends on what else runs, its CPU time
// much less.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
