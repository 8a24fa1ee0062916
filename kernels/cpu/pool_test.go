package cpu

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// countJob records how often each part of a call ran and with which part
// count.
type countJob struct {
	runs  [64]atomic.Int32
	badNP atomic.Int32
	np    int
}

func (j *countJob) run(p, np int) {
	if np != j.np {
		j.badNP.Add(1)
	}
	j.runs[p].Add(1)
}

// setPolicy sets the callers' part of the spin policy under poolMu (the
// workers may be running) and returns a func restoring it.
func setPolicy(chunks int, steal bool) (restore func()) {
	poolMu.Lock()
	oc, os := poolChunks, poolSteal
	poolChunks, poolSteal = chunks, steal
	poolMu.Unlock()
	return func() {
		poolMu.Lock()
		poolChunks, poolSteal = oc, os
		poolMu.Unlock()
	}
}

// TestRunPartsEachOnce: under every policy (static parts or chunks, with
// or without steal-back), every part of every call runs exactly once,
// whether the workers are spinning, parked (a pause longer than poolSpin
// between calls) or not yet started when the caller is done, including
// the parts the caller takes back (runParts).
func TestRunPartsEachOnce(t *testing.T) {
	for _, chunks := range []int{1, 4, 8} {
		for _, steal := range []bool{false, true} {
			t.Run(fmt.Sprintf("chunks=%d/steal=%v", chunks, steal), func(t *testing.T) {
				defer setPolicy(chunks, steal)()
				for _, parts := range []int{2, 3, 5} {
					for call := range 300 {
						j := &countJob{np: parts}
						if chunks > 1 {
							j.np = parts * chunks
						}
						poolMu.Lock()
						runParts(j, parts)
						poolMu.Unlock()
						if b := j.badNP.Load(); b != 0 {
							t.Fatalf("parts=%d call %d: %d runs with the wrong part count", parts, call, b)
						}
						for p := range j.np {
							if n := j.runs[p].Load(); n != 1 {
								t.Fatalf("parts=%d call %d: part %d of %d ran %d times", parts, call, p, j.np, n)
							}
						}
						if call%50 == 49 {
							time.Sleep(poolSpin + time.Millisecond) // let the workers park
						}
					}
				}
			})
		}
	}
}

// extCount is a Job recording its parts.
type extCount struct{ countJob }

func (j *extCount) Run(p, np int) { j.run(p, np) }

// TestParallel: Parallel runs every part exactly once with the caller's
// part count (static parts even when the pool chunks its own calls),
// with workers spinning or parked.
func TestParallel(t *testing.T) {
	for _, chunks := range []int{1, 4} {
		restore := setPolicy(chunks, true)
		for _, parts := range []int{1, 2, 3, 5} {
			for call := range 200 {
				j := &extCount{countJob{np: parts}}
				Parallel(j, parts)
				if b := j.badNP.Load(); b != 0 {
					t.Fatalf("chunks=%d parts=%d call %d: %d runs with the wrong part count", chunks, parts, call, b)
				}
				for p := range parts {
					if n := j.runs[p].Load(); n != 1 {
						t.Fatalf("chunks=%d parts=%d call %d: part %d ran %d times", chunks, parts, call, p, n)
					}
				}
				if call%50 == 49 {
					time.Sleep(poolSpin + time.Millisecond) // let the workers park
				}
			}
		}
		restore()
	}
}
