package engine

// Scheduling: which sequences run in the next step and for how many
// tokens, and the flat batch that step hands to the backend.

import (
	"fmt"
	"slices"
	"time"

	"chunlian/forward"
	"chunlian/kvcache"
)

// preempt evicts running sequence s by recompute: its blocks are freed (its
// full blocks stay findable in the prefix cache) and it goes to the front of
// waiting with nothing computed.
func (e *Paged) preempt(s *sequence) {
	e.mgr.Free(s.id)
	s.numComputed, s.adopted = 0, 0
	s.state = stWaiting
	e.waiting = slices.Insert(e.waiting, 0, s)
	e.preemptions++
}

// scheduleStep fills the current stepBuf: the scheduled entries, the flat
// batch, pending block copies sent to the backend, the device-draw plan
// and a logits buffer of the right size. It takes at most maxSeqs
// sequences; inFlight says a step is still on the device. It reports false
// when nothing could be scheduled.
//
// The rule is vLLM v1's, one for prefill and decode alike: every
// sequence is owed the tokens it holds beyond those computed (one for a
// decode, the rest of its prompt for a chunked prefill), and the step
// pays them out of one token budget, running sequences first.
func (e *Paged) scheduleStep(maxSeqs int, inFlight bool) bool {
	e.t0 = time.Now()
	e.sched = e.sched[:0]
	budget, preempted := e.scheduleRunning(e.cfg.MaxNumBatchedTokens, maxSeqs)
	if !preempted {
		e.admitWaiting(budget, maxSeqs)
	}
	if len(e.sched) == 0 {
		if !preempted && len(e.running) == 0 && len(e.waiting) > 0 && !inFlight {
			// Cannot happen with Generate's size check; fail rather than spin.
			e.fail(e.waiting[0].r, ErrTooLong, FinishAbort)
			e.compact()
		}
		return false
	}

	e.buildBatch()
	if src, dst, slots := e.mgr.TakeCopies(); len(src) > 0 {
		if err := e.b.CopyBlocks(src, dst, slots); err != nil {
			e.failAll(fmt.Errorf("engine: copy blocks: %w", err))
			return false
		}
	}
	hostRows := len(e.batch.LogitRows) // logits rows the host receives or makes
	if e.db != nil {
		e.planDraws()
		hostRows = len(e.dp.hostRows) + len(e.dp.peekRows)
	}
	if cap(e.logits) < hostRows*e.vocab {
		// Twice the rows: host rows come in bursts (many 横批 requests at
		// their first step), and each new maximum would otherwise cost a
		// reallocation and a refill of every peeked row.
		e.logits = make([]float32, 2*hostRows*e.vocab)
		e.dp.peekClean = 0
	}
	e.logits = e.logits[:hostRows*e.vocab]
	return true
}

// scheduleRunning schedules running sequences in admission order, each
// for the tokens it still needs, within budget, preempting from the back
// when blocks run out. Sequences of a step still on the device (inflight)
// wait for their results. It returns the budget left and whether it
// preempted.
func (e *Paged) scheduleRunning(budget, maxSeqs int) (int, bool) {
	preempted := false
	for i := 0; i < len(e.running) && budget > 0 && len(e.sched) < maxSeqs; i++ {
		s := e.running[i]
		if s.inflight {
			continue
		}
		n := min(s.want()-s.numComputed, budget)
		for !e.mgr.Allocate(s.id, n, kvcache.Computed{}) {
			// Kept samples go before running ones, and so do the blocks
			// waiting sequences took over from kept samples.
			if e.dropOldestKept() || e.dropAdopted(nil) {
				continue
			}
			// Out of blocks: preempt the most recently admitted running
			// sequence not in flight (possibly s itself). Scheduled ones
			// sit before i, so they are never victims.
			v := len(e.running) - 1
			for v > i && e.running[v].inflight {
				v--
			}
			victim := e.running[v]
			e.running = slices.Delete(e.running, v, v+1)
			e.preempt(victim)
			preempted = true
			if victim == s {
				return budget, true
			}
		}
		e.sched = append(e.sched, entry{s: s, n: n})
		budget -= n
	}
	return budget, preempted
}

// admitWaiting admits waiting sequences in order (FCFS: it stops at the
// first that does not fit), each with its prefix-cache hit, within budget.
func (e *Paged) admitWaiting(budget, maxSeqs int) {
	for len(e.waiting) > 0 && budget > 0 && len(e.sched) < maxSeqs && len(e.running) < maxSeqs {
		s := e.waiting[0]
		r := s.r
		var hit kvcache.Computed
		cached := 0
		switch {
		case s.adopted > 0: // a kept sample's cache (Request.From)
			e.mgr.Truncate(s.id, s.adopted)
			cached = s.adopted
		case !r.wantsPromptRows():
			// Pending jump-forward tokens need the rows before them
			// computed: the hit stops short of them.
			hit = e.mgr.ComputedBlocks(s.tokens[:len(s.tokens)-s.pend])
			cached = hit.Tokens(e.cfg.BlockSize)
		}
		n := min(s.want()-cached, budget)
		for !e.mgr.Allocate(s.id, n, hit) {
			// Freeing a kept sample only releases blocks (hit's stay
			// findable until a Get), so hit is still good.
			if !e.dropOldestKept() && !e.dropAdopted(s) {
				return
			}
		}
		if (r.req.Keep || r.req.Final) && s.adopted == 0 {
			// What a kept request generates is continued through its
			// handle, and a final one's not at all: neither is found by
			// hash (an adopted sequence keeps the bound it was kept with).
			e.mgr.SetCacheLimit(s.id, len(r.req.Prompt))
		}
		e.waiting = e.waiting[1:]
		s.numComputed = cached
		s.state = stRunning
		e.running = append(e.running, s)
		if e.markAdmitted(r) {
			r.scheduled = time.Now()
			r.cached = cached
			e.promptTokens += int64(len(r.req.Prompt))
			if e.cfg.EnablePrefixCaching {
				e.prefixQueries += int64(len(s.tokens))
				e.prefixHits += int64(cached)
			}
		}
		e.sched = append(e.sched, entry{s: s, n: n})
		budget -= n
	}
}

// buildBatch lays the scheduled entries out as one flat forward.Batch.
func (e *Paged) buildBatch() {
	b := &e.batch
	b.Tokens, b.Positions, b.SlotMapping = b.Tokens[:0], b.Positions[:0], b.SlotMapping[:0]
	b.Seqs, b.LogitRows = b.Seqs[:0], b.LogitRows[:0]
	for k := range e.sched {
		en := &e.sched[k]
		s, r := en.s, en.s.r
		start := len(b.Tokens)
		bt := e.mgr.BlockTable(s.id) // one lookup per sequence
		for p := s.numComputed; p < s.numComputed+en.n; p++ {
			b.Tokens = append(b.Tokens, s.tokens[p])
			b.Positions = append(b.Positions, int32(p))
			b.SlotMapping = append(b.SlotMapping, kvcache.SlotIn(bt, e.cfg.BlockSize, p))
		}
		b.Seqs = append(b.Seqs, forward.SeqSpan{Start: start, Len: en.n, CtxLen: s.numComputed + en.n, BlockTable: bt})
		en.rowStart = len(b.LogitRows)
		en.plpFrom, en.plpTo = 0, 0
		if !r.forked && r.wantsPromptRows() {
			lo := max(s.numComputed, r.plpDone)
			hi := min(s.numComputed+en.n, len(r.req.Prompt)-1)
			if lo < hi {
				en.plpFrom, en.plpTo = lo, hi
				for p := lo; p < hi; p++ {
					b.LogitRows = append(b.LogitRows, start+p-s.numComputed)
				}
			}
		}
		en.cfFrom, en.cfTo = 0, 0
		if s.pend > 0 {
			lo := max(s.numComputed, len(s.tokens)-s.pend-1)
			hi := min(s.numComputed+en.n, len(s.tokens)-1)
			if lo < hi {
				en.cfFrom, en.cfTo = lo, hi
				for p := lo; p < hi; p++ {
					b.LogitRows = append(b.LogitRows, start+p-s.numComputed)
				}
			}
		}
		en.sample = s.numComputed+en.n == len(s.tokens)
		if en.sample {
			b.LogitRows = append(b.LogitRows, start+en.n-1)
		}
	}
}
