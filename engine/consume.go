package engine

// Consumption of results: a finished step's logits or device draws become
// tokens, log-probs, events, finishes and completed requests.

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"chunlian/sampler"
)

// fail ends every live sequence of r (emitting Done events with reason) and
// completes r with err.
func (e *Paged) fail(r *request, err error, reason FinishReason) {
	if r.complete {
		return
	}
	r.err = err // before finish, which may complete r
	for _, s := range r.seqs {
		if s.state != stDone {
			e.finish(s, reason)
		}
		if s.handle != 0 { // kept before the request failed: nobody will continue it
			e.dropKept(s.handle)
			s.handle = 0
		}
	}
	// Samples never forked end too, so the caller sees n Done events.
	if !r.forked {
		for i := 1; i < r.n; i++ {
			e.emit(r, Event{Index: i, Token: -1, Done: true, Finish: reason})
		}
	}
	if !r.complete {
		e.completeRequest(r)
	}
}

func (e *Paged) emit(r *request, ev Event) {
	if r.req.OnEvent != nil {
		r.req.OnEvent(ev)
	}
}

// finish ends sequence s: frees its blocks and its ID, emits its Done
// event (Token -1: every token was already sent in its own event) and
// completes the request when it was the last live sequence. A finished
// sequence is not finished again (its ID may already be another's).
func (e *Paged) finish(s *sequence, reason FinishReason) {
	if s.state == stDone {
		return
	}
	r := s.r
	keep := r.req.Keep && (reason == FinishStop || reason == FinishLength) && r.err == nil
	// The riders go on (or finish by their own tasks) with caches of
	// their own, taken before s's goes. When the request fails they are
	// finished next by fail, and need none; otherwise s has its cache (it
	// finishes only in the step that computed it, or by fail).
	for _, c := range s.riders {
		if c.rides(s) {
			if r.err == nil && e.mgr.Has(s.id) {
				e.split(c)
			} else {
				c.host = nil
			}
		}
	}
	s.riders = s.riders[:0]
	if h := s.host; h != nil && keep && e.mgr.Has(h.id) {
		e.split(s) // a kept sample needs a cache of its own
	}
	s.state = stDone
	s.finish = reason
	switch {
	case s.id == noSeq: // a rider holds no cache
		s.host = nil
	case keep && e.mgr.Has(s.id):
		s.handle = e.keep(s)
	default:
		e.mgr.Free(s.id)
		e.freeIDs = append(e.freeIDs, s.id)
	}
	e.emit(r, Event{Index: s.index, Token: -1, Done: true, Finish: reason})
	r.live--
	if r.live == 0 && !r.complete {
		e.completeRequest(r)
	}
}

// completeRequest builds the result (unless r failed) and queues r to be
// woken at the end of the loop iteration.
func (e *Paged) completeRequest(r *request) {
	r.complete = true
	e.markAdmitted(r)
	now := time.Now()
	if r.err == nil {
		res := &Result{PromptLogProbs: r.plp, PromptTokens: len(r.req.Prompt), CachedTokens: r.cached,
			ComputedTokens: r.computed, Completions: make([]Completion, 0, r.n)}
		for i := 0; i < r.n; i++ {
			if i < len(r.seqs) {
				s := r.seqs[i]
				res.Completions = append(res.Completions, Completion{Index: i, Tokens: slices.Clip(s.generated()), LogProbs: slices.Clip(s.logprobs), Finish: s.finish, Handle: s.handle})
			} else { // MaxTokens == 0: scored only, never forked
				res.Completions = append(res.Completions, Completion{Index: i, Tokens: []int32{}, Finish: FinishLength})
			}
		}
		t := &res.Timings
		t.Queue = r.scheduled.Sub(r.arrival)
		t.Prefill = r.prefilled.Sub(r.scheduled)
		if !r.firstTok.IsZero() {
			t.FirstToken = r.firstTok.Sub(r.arrival)
			t.Decode = r.lastTok.Sub(r.firstTok)
		}
		t.Total = now.Sub(r.arrival)
		r.res = res
	}
	e.wake = append(e.wake, r)
}

// failAll fails every active request (a backend error).
func (e *Paged) failAll(err error) {
	for _, r := range e.active {
		if !r.complete {
			e.fail(r, err, FinishAbort)
		}
	}
	e.compact()
}

// consume turns one step's logits ([rows, V]) into state changes, in three
// phases:
//
//  1. engine goroutine: mark the scheduled tokens computed, cache their full
//     blocks, fork the samples of requests whose prompt just finished, and
//     list the sampling tasks (one per sequence that samples, by row);
//  2. the sampling workers (rowSampler.run): each row's log-sum-exp where
//     needed and every task's processor + Sampler, rows in parallel;
//  3. engine goroutine: prompt log-probs, tokens appended in schedule
//     order, events, stop rules, finishes.
//
// Phase 2 touches only per-task outputs, per-row lse entries, the tasks'
// Samplers and processors and its workers' own Scratch, and reads logits
// and the sequences' tokens, which nobody writes meanwhile; the engine
// goroutine waits for it to end, so phases 1 and 3 see everything as
// before. Whatever the number of workers, each row is computed by the
// same code from the same inputs, so tokens and log-probs do not depend on
// it.
func (e *Paged) consume(logits []float32, rows int, lse []float64) {
	now := time.Now()
	e.listTasks(now)
	if e.db != nil {
		e.resolveDraws(logits, lse, rows)
	} else {
		e.rs.run(logits, e.vocab, rows, lse, e.samplingWorkers(rows))
	}
	for k := range e.sched {
		en := &e.sched[k]
		s := en.s
		if s.state == stDone { // its request failed earlier in this loop
			continue
		}
		r := s.r
		for p := en.plpFrom; p < en.plpTo; p++ {
			row := en.rowStart + p - en.plpFrom
			var v float32
			if e.db != nil {
				v = e.dp.drawn[en.plpDraw+p-en.plpFrom].Logit
			} else {
				v = logits[row*e.vocab+int(r.req.Prompt[p+1])]
			}
			r.plp[p] = float32(float64(v) - lse[row])
			r.plpDone = p + 1
		}
		if en.scoreOnly {
			for i := 1; i < r.n; i++ {
				e.emit(r, Event{Index: i, Token: -1, Done: true, Finish: FinishLength})
			}
			e.finish(s, FinishLength)
			continue
		}
		// The riders' jump-forward tokens are s's: confirm them first,
		// while they ride (s's confirm may finish s and split them).
		for _, c := range s.riders {
			if c.rides(s) {
				e.confirm(en, c, logits, lse, now)
			}
		}
		e.confirm(en, s, logits, lse, now)
		for i := en.taskLo; i < en.taskHi; i++ {
			if r.complete {
				break
			}
			e.applySample(&e.rs.tasks[i], now)
		}
		if s.state != stDone && len(s.riders) > 0 {
			e.regroup(s)
		}
	}
}

// regroup splits off the riders of s whose tokens are no longer s's; of
// those that drew the same tokens, the first gets a cache (a fork of
// s's) and the others ride it.
func (e *Paged) regroup(s *sequence) {
	kept, split := s.riders[:0], e.splitBuf[:0]
	for _, c := range s.riders {
		switch {
		case !c.rides(s):
		case slices.Equal(c.tokens, s.tokens):
			kept = append(kept, c)
		default:
			split = append(split, c)
		}
	}
	clear(s.riders[len(kept):])
	s.riders = kept
	for i, c := range split {
		if c.host != s {
			continue // riding an earlier one of split
		}
		e.split(c)
		for _, d := range split[i+1:] {
			if d.host == s && slices.Equal(d.tokens, c.tokens) { // not yet given to an earlier one
				d.host = c
				c.riders = append(c.riders, d)
			}
		}
	}
	clear(split)
	e.splitBuf = split[:0]
}

// split gives rider c a cache of its own, a fork of its host's (which
// holds the computed tokens they share), and makes it a running sequence
// from the end of the step.
func (e *Paged) split(c *sequence) {
	h := c.host
	c.host = nil
	c.id = e.takeID()
	e.mgr.Fork(h.id, c.id)
	c.numComputed = h.numComputed
	c.state = stRunning
	e.children = append(e.children, c)
}

// listTasks is consume's phase 1.
func (e *Paged) listTasks(now time.Time) {
	rs := &e.rs
	rs.tasks = rs.tasks[:0]
	for k := range e.sched {
		en := &e.sched[k]
		s := en.s
		en.taskLo, en.taskHi, en.scoreOnly = 0, 0, false
		if s.state == stDone {
			continue
		}
		s.numComputed += en.n
		s.r.computed += en.n
		e.mgr.CacheBlocks(s.id, s.tokens, s.numComputed)
		if !en.sample {
			if r := s.r; !r.forked && s.terminal() && s.numComputed == s.want() {
				// A lone sample forced to its end at admission (add):
				// its prompt is done and confirm finishes it this step.
				e.fork(s, now)
			}
			continue
		}
		row := en.sampleRow()
		en.taskLo = len(rs.tasks)
		if r := s.r; !r.forked {
			if len(s.tokens) < e.cfg.BlockSize {
				// A prompt shorter than a block never becomes a full
				// cached block; short prompts are the ones that come back
				// (a keyword couplet's prompt is 6 tokens), so keep a
				// copy of its block for the next request with it.
				e.mgr.SnapshotTail(s.id)
			}
			en.scoreOnly = e.fork(s, now)
			if !en.scoreOnly {
				for i, c := range r.seqs {
					rs.tasks = append(rs.tasks, sampleTask{s: c, row: row, plan: int32(en.planLo + i)})
				}
			}
		} else {
			rs.tasks = append(rs.tasks, sampleTask{s: s, row: row, plan: int32(en.planLo)})
			// The riders as planDraws listed them: none has finished or
			// split since, as only s's own entry (below) or the failing of
			// its request (which ends s too) changes them.
			for _, c := range s.riders {
				if c.rides(s) {
					rs.tasks = append(rs.tasks, sampleTask{s: c, row: row, plan: int32(en.planLo + len(rs.tasks) - en.taskLo)})
				}
			}
		}
		en.taskHi = len(rs.tasks)
		e.sampledTokens += int64(en.taskHi - en.taskLo)
	}
}

// confirm takes the log-probs of the jump-forward tokens that en's rows
// score into its sequence, sending their events and applying the stop
// rules, as the step that would have sampled each would have. A token
// whose logit is -Inf or NaN is the dead end that step would have hit
// (sampler.Forcer's "force tok"): the sequence ends before it.
func (e *Paged) confirm(en *entry, s *sequence, logits []float32, lse []float64, now time.Time) {
	row0 := en.rowStart + en.plpTo - en.plpFrom
	for p := en.cfFrom; p < en.cfTo && s.state != stDone; p++ {
		row, tok := row0+p-en.cfFrom, s.tokens[p+1]
		var v float32
		if e.db != nil {
			v = e.dp.drawn[en.cfDraw+p-en.cfFrom].Logit
		} else {
			v = logits[row*e.vocab+int(tok)]
		}
		if !(v > negInf32) {
			s.tokens, s.pend = s.tokens[:p+1], 0
			e.finish(s, FinishDeadEnd)
			return
		}
		s.pend--
		e.accept(s, tok, float32(float64(v)-lse[row]), now)
	}
}

// fork handles the request of prompt sequence s (seqs[0]) whose prompt is
// now fully computed: score-only requests (MaxTokens == 0) report true and
// are finished by the caller after their prompt log-probs are written;
// otherwise the other N-1 samples ride s (sequence.host) until their
// tokens part from its, which for most is at their first draw.
func (e *Paged) fork(s *sequence, now time.Time) (scoreOnly bool) {
	r := s.r
	r.forked = true
	r.prefilled = now
	if r.req.Params.MaxTokens == 0 {
		return true
	}
	// One allocation each for the samples' tokens and log-probs: every
	// sample gets a window of the size add gives the prompt sequence,
	// capped by a full slice expression, so that a sample outgrowing its
	// window reallocates instead of writing into the next one.
	room := cap(s.tokens)
	toks := make([]int32, (r.n-1)*room)
	lpRoom := min(r.req.Params.MaxTokens, 64)
	lps := make([]float32, r.n*lpRoom)
	s.logprobs = append(lps[0:0:lpRoom], s.logprobs...)
	s.riders = slices.Grow(s.riders[:0], r.n-1)
	for i := 1; i < r.n; i++ {
		w := toks[(i-1)*room : i*room : i*room]
		c := e.newRider(r, i, append(w[:0], s.tokens...), s)
		c.logprobs = lps[i*lpRoom : i*lpRoom : (i+1)*lpRoom]
		r.seqs = append(r.seqs, c)
	}
	r.live = r.n
	return false
}

// applySample takes task t's drawn token (or error) into its sequence,
// streams it and checks the stop rules. Engine goroutine.
func (e *Paged) applySample(t *sampleTask, now time.Time) {
	s := t.s
	if s.state == stDone {
		return
	}
	r := s.r
	if t.err != nil {
		if errors.Is(t.err, sampler.ErrDeadEnd) {
			e.finish(s, FinishDeadEnd)
		} else {
			e.fail(r, fmt.Errorf("engine: logits processor: %w", t.err), FinishAbort)
		}
		return
	}
	s.tokens = append(s.tokens, t.tok)
	if e.accept(s, t.tok, t.lp, now) {
		e.jumpForward(s)
	}
}

// accept takes s's next token tok (already in s.tokens) with its raw
// log-prob lp: it streams it and applies the stop rules. It reports
// whether s goes on.
func (e *Paged) accept(s *sequence, tok int32, lp float32, now time.Time) bool {
	r := s.r
	s.logprobs = append(s.logprobs, lp)
	e.genTokens++
	if r.firstTok.IsZero() {
		r.firstTok = now
	}
	r.lastTok = now
	e.emit(r, Event{Index: s.index, Token: tok})
	switch {
	case slices.Contains(r.req.Params.StopTokens, tok):
		e.finish(s, FinishStop)
	case len(s.logprobs) >= r.req.Params.MaxTokens:
		e.finish(s, FinishLength)
	default:
		return true
	}
	return false
}

// jumpForward appends to s the run of tokens its processor forces next
// (sampler.Masker with Mask.Forced), each known without a row, so that the
// next step computes them as one chunk, like a prefill, instead of taking
// a step each (the jump-forward of structured-output engines). Their
// log-probs and events come from that chunk's rows (confirm). The run
// stops before a token outside the vocabulary (the next step's sampler
// then reports the dead end, as without the jump), after a stop token and
// at MaxTokens. Each jumped token takes the random number its own step
// would have drawn, so seeded samples keep their streams. With a
// repetition penalty (which can turn a forced token into a dead end by
// itself) nothing is jumped.
func (e *Paged) jumpForward(s *sequence) {
	mk, ok := s.proc.(sampler.Masker)
	par := &s.r.req.Params
	if !ok || e.cfg.noJump || (par.RepetitionPenalty > 0 && par.RepetitionPenalty != 1) {
		return
	}
	m := &e.jumpMask
	if e.deviceDraws() {
		m = &s.mask // kept for the next step's plan
	}
	s.maskAt = 0
	for len(s.tokens)-len(s.r.req.Prompt) < par.MaxTokens && !s.terminal() {
		m.Reset()
		ok := mk.Mask(s.generated(), m)
		if !ok || !m.Forced || m.Force < 0 || int(m.Force) >= e.vocab {
			if m == &s.mask {
				s.maskAt, s.masked = len(s.tokens), ok
			}
			return
		}
		if par.Temperature != 0 {
			s.samp.Uniform()
		}
		s.tokens = append(s.tokens, m.Force)
		s.pend++
		e.jumpTokens++
	}
}

// consumeStep takes a finished step's results (lse: [rows]) into the
// sequences.
func (e *Paged) consumeStep(lse []float64) {
	e.steps++
	e.computedTokens += int64(len(e.batch.Tokens))
	e.logitRows += int64(len(e.batch.LogitRows))
	e.consume(e.logits, len(e.batch.LogitRows), lse)
	e.compact()
	for _, c := range e.children {
		if c.state == stRunning {
			e.running = append(e.running, c)
		}
	}
	clear(e.children)
	e.children = e.children[:0]
}
