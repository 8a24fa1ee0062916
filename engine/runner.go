package engine

import (
	"fmt"
	"math"
	"time"

	"chunlian/forward"
)

// The step runner: it executes scheduled steps on the backend. The loop
// calls iterate once per iteration; the scheduling rule (schedule.go) and
// the consumption of results (consume.go) are the same for both runners.
type runner interface {
	// iterate runs at most one step (syncRunner) or launches one and
	// consumes the one launched before (overlapRunner).
	iterate(e *Paged)
	// inFlight reports a launched step not yet consumed.
	inFlight() bool
	// drain consumes the step in flight, if any (shutdown).
	drain(e *Paged)
}

// newRunner picks the runner for e's backend: two steps in flight on an
// AsyncDrawBackend, one at a time otherwise.
func newRunner(e *Paged) runner {
	if e.ab != nil {
		return &overlapRunner{}
	}
	return syncRunner{}
}

// syncRunner schedules one batch, runs it and consumes its results, one
// step at a time, on any Backend (the CPU path).
type syncRunner struct{}

func (syncRunner) inFlight() bool { return false }
func (syncRunner) drain(*Paged)   {}

func (syncRunner) iterate(e *Paged) {
	if len(e.running)+len(e.waiting) == 0 || !e.scheduleStep(e.cfg.MaxNumSeqs, false) {
		return
	}
	t1 := time.Now()
	rows := len(e.batch.LogitRows)
	var err error
	if e.db != nil {
		err = e.db.ForwardDraw(&e.batch, e.dp.draws, e.dp.drawn, e.dp.hostRows, e.hostLogits())
	} else {
		err = e.b.Forward(&e.batch, e.logits)
	}
	if err != nil {
		e.failAll(fmt.Errorf("engine: forward: %w", err))
		return
	}
	t2 := time.Now()
	e.consumeStep(e.rowLSE(rows))
	e.phases.Schedule += t1.Sub(e.t0).Seconds()
	e.phases.Forward += t2.Sub(t1).Seconds()
	e.phases.Consume += time.Since(t2).Seconds()
}

// overlapRunner keeps two steps in flight on an AsyncDrawBackend (the GPU
// path): each iteration schedules and launches a step from the sequences
// not in flight (on the stepBuf not in use), then waits for and consumes
// the step launched in the previous iteration while the device computes
// the new one. Under load the running sequences fall into two groups that
// alternate; a lone request runs launch, land, launch, land, as
// syncRunner does.
type overlapRunner struct {
	pend *stepBuf // the launched step not yet consumed
	next int      // the bufs slot the next step is scheduled into
}

func (o *overlapRunner) inFlight() bool { return o.pend != nil }

func (o *overlapRunner) drain(e *Paged) {
	if p := o.pend; p != nil {
		o.pend = nil
		e.stepBuf = p
		e.landStep()
	}
}

func (o *overlapRunner) iterate(e *Paged) {
	a := &e.bufs[o.next]
	e.stepBuf = a
	// Two steps in flight pay only when the host's work per step is
	// comparable to the device's: below OverlapMinSeqs sequences a second
	// group would double every sequence's device time per token, so a
	// step is launched only when none is in flight (as syncRunner does).
	load := len(e.running) + len(e.waiting)
	launched := false
	if load > 0 && (o.pend == nil || load >= e.cfg.OverlapMinSeqs) {
		maxSeqs := e.cfg.MaxNumSeqs
		if o.pend == nil && len(e.running) >= e.cfg.OverlapMinSeqs {
			// Nothing in flight under load: take half of the running
			// sequences, so that the other half forms the second group.
			maxSeqs = min(maxSeqs, max(1, len(e.running)/2))
		}
		launched = e.launchStep(maxSeqs, o.pend != nil)
	}
	o.drain(e)
	if launched {
		o.pend = a
		o.next ^= 1
	}
}

// launchStep schedules a step into the current stepBuf and launches it on
// its slot without waiting. It reports whether it launched.
func (e *Paged) launchStep(maxSeqs int, inFlight bool) bool {
	if !e.scheduleStep(maxSeqs, inFlight) {
		return false
	}
	t1 := time.Now()
	if err := e.ab.LaunchDraw(e.slot, &e.batch, e.dp.draws, e.dp.hostRows); err != nil {
		e.failAll(fmt.Errorf("engine: forward: %w", err))
		return false
	}
	for k := range e.sched {
		e.sched[k].s.inflight = true
	}
	e.phases.Schedule += t1.Sub(e.t0).Seconds()
	e.phases.Forward += time.Since(t1).Seconds()
	return true
}

// landStep waits for the launched step in the current stepBuf and
// consumes it.
func (e *Paged) landStep() {
	t1 := time.Now()
	rows := len(e.batch.LogitRows)
	if cap(e.lse32) < rows {
		e.lse32 = make([]float32, rows)
	}
	lse32 := e.lse32[:rows]
	err := e.ab.WaitDraw(e.slot, e.dp.drawn, e.hostLogits(), lse32)
	for k := range e.sched {
		e.sched[k].s.inflight = false
	}
	if err != nil {
		e.failAll(fmt.Errorf("engine: forward: %w", err))
		return
	}
	t2 := time.Now()
	e.consumeStep(e.widenLSE(lse32, rows))
	e.phases.Forward += t2.Sub(t1).Seconds()
	e.phases.Consume += time.Since(t2).Seconds()
}

// rowLSE returns the step's [rows] log-sum-exp slice: filled from the
// backend when it computed them (forward.RowLSEBackend), otherwise NaN
// entries that the sampling phase fills for the rows that need them.
func (e *Paged) rowLSE(rows int) []float64 {
	var got []float32
	if lb, ok := e.b.(forward.RowLSEBackend); ok {
		got = lb.LogSumExp()
	}
	return e.widenLSE(got, rows)
}

// widenLSE returns the step's log-sum-exps ([rows], in e.lse): got's when
// it holds one per row, else NaN (unknown: the host computes them).
func (e *Paged) widenLSE(got []float32, rows int) []float64 {
	if cap(e.lse) < rows {
		e.lse = make([]float64, rows)
	}
	lse := e.lse[:rows]
	if len(got) == rows {
		for i, v := range got {
			lse[i] = float64(v)
		}
		return lse
	}
	for i := range lse {
		lse[i] = math.NaN()
	}
	return lse
}
