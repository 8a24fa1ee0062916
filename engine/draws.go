package engine

import (
	"cmp"
	"math"
	"slices"

	"chunlian/forward"
	"chunlian/sampler"
)

var negInf32 = float32(math.Inf(-1))

// Device draws (forward.DrawBackend).
//
// On a backend that can draw tokens where the logits are (the GPU), the
// engine plans every step's draws before the forward pass, from state that
// the pass does not change: each sampling task's processor says what it
// will do to the row (sampler.Masker), each prompt log-prob row asks only
// for the logit of the next prompt token (a Force draw). The backend then
// returns 8 bytes per draw instead of a 6,189-float row, and the host
// sampling phase shrinks to the few rows whose processor must read the row
// itself. Those that read it at a few ids only (sampler.Mask.Peek: the first
// step of the forced 横批 samples, which ranks the candidates by their
// first characters' logits) get those logits as Force draws and a host
// row rebuilt from them; the rest (a repetition penalty, an unknown
// processor) are copied whole. Both are sampled on the host as before.
//
// Invariant: plan and consume list a step's sampling tasks in the same
// order (schedule order; a request that forks lists its N samples by
// index), so consume's k-th task of an entry is plan.tasks[en.planLo+k].
// All of it is loop-owned.

// Task plan codes besides a draw index (≥ 0).
const (
	taskHost = -1 // sampled on the host from its copied or rebuilt row
	taskDead = -2 // the processor forces a token outside the vocabulary: a dead end
)

// drawPlan is one step's device-draw plan and results.
type drawPlan struct {
	draws    []forward.Draw
	drawn    []forward.Drawn
	tasks    []int32 // per sampling task: index into draws, taskHost or taskDead
	hostRows []int32 // logits rows copied to the host, ascending
	hostIdx  []int32 // [rows]: row → its host row (peekRows, then hostRows), -1 if none
	// Rows whose tasks read only a few logits (sampler.Mask.Peek): those come
	// back as Force draws (peeks[i]: draws[d0:d1] of row), and the host
	// row is made from them (-Inf elsewhere). They come first in the
	// stepBuf's logits, the copied rows after them (hostLogits).
	peekRows []int32
	peeks    []peek
	// peekClean: the stepBuf's logits rows [0, peekClean) are -Inf
	// everywhere between steps, so a peeked row costs its few writes and
	// their reset instead of a fill of V floats (at thousands of sequences
	// the fills showed in the engine goroutine's profile). Reset to 0 when
	// logits is reallocated; rows the copied rows overwrite leave it.
	peekClean int
	excl      []int32 // backing store of the draws' Exclude lists
	mask      sampler.Mask

	hostTasks []sampleTask // the host tasks of a step, rows renumbered to hostIdx, sorted by them; plan = index in rs.tasks
	hostLSE   []float64
}

// peek is one peeking task's gathered logits: draws[d0:d1] on row.
type peek struct {
	row    int32
	d0, d1 int
}

// hostIdx marks while planning (then replaced by indices).
const (
	markHost = -2 // the whole row is needed
	markPeek = -3 // only peeked logits are needed
)

// maxPeek bounds the ids one peeking task may gather.
const maxPeek = 64

// deviceDraws reports whether this engine plans device draws.
func (e *Paged) deviceDraws() bool { return e.db != nil }

// planDraws plans the step laid out by buildBatch (see drawPlan).
func (e *Paged) planDraws() {
	p := &e.dp
	rows := len(e.batch.LogitRows)
	p.draws, p.tasks, p.excl, p.hostRows = p.draws[:0], p.tasks[:0], p.excl[:0], p.hostRows[:0]
	p.peekRows, p.peeks = p.peekRows[:0], p.peeks[:0]
	if cap(p.hostIdx) < rows {
		p.hostIdx = make([]int32, rows)
	}
	p.hostIdx = p.hostIdx[:rows]
	for i := range p.hostIdx {
		p.hostIdx[i] = -1
	}
	for k := range e.sched {
		en := &e.sched[k]
		s, r := en.s, en.s.r
		en.plpDraw = len(p.draws)
		for q := en.plpFrom; q < en.plpTo; q++ {
			p.draws = append(p.draws, forward.Draw{Row: int32(en.rowStart + q - en.plpFrom), Force: r.req.Prompt[q+1], Mask: -1})
		}
		en.cfDraw = len(p.draws)
		for q := en.cfFrom; q < en.cfTo; q++ {
			p.draws = append(p.draws, forward.Draw{Row: int32(en.rowStart + en.plpTo - en.plpFrom + q - en.cfFrom), Force: s.tokens[q+1], Mask: -1})
		}
		en.planLo = len(p.tasks)
		if !en.sample {
			continue
		}
		row := en.sampleRow()
		switch {
		case r.forked:
			e.planTask(row, s.samp, s.proc, s.generated(), s)
			for _, c := range s.riders { // consume lists their tasks in this order
				if c.rides(s) {
					e.planTask(row, c.samp, c.proc, c.generated(), c)
				}
			}
		case r.req.Params.MaxTokens == 0: // score-only: fork draws nothing
		default: // the step the request forks: all N samples draw from row
			for i := range r.n {
				samp, proc := e.sampleState(r, i)
				own := s // sample 0 is s: the mask add's jumpForward left
				if i > 0 {
					own = nil
				}
				e.planTask(row, samp, proc, s.generated(), own)
			}
		}
	}
	for row, h := range p.hostIdx {
		if h == markPeek {
			p.hostIdx[row] = int32(len(p.peekRows))
			p.peekRows = append(p.peekRows, int32(row))
		}
	}
	for row, h := range p.hostIdx {
		if h == markHost {
			p.hostIdx[row] = int32(len(p.peekRows) + len(p.hostRows))
			p.hostRows = append(p.hostRows, int32(row))
		}
	}
	e.peekedRows += int64(len(p.peekRows))
	if cap(p.drawn) < len(p.draws) {
		p.drawn = make([]forward.Drawn, len(p.draws), 2*len(p.draws))
	}
	p.drawn = p.drawn[:len(p.draws)]
}

// planTask plans one sampling task on row: a draw when its processor can
// say what it does without the row, else the host way (row copied). s,
// when not nil, is the task's sequence, whose mask jumpForward may have
// left for this position.
func (e *Paged) planTask(row int32, samp *sampler.Sampler, proc sampler.LogitsProcessor, gen []int32, s *sequence) {
	p := &e.dp
	par := samp.Params()
	m := &p.mask
	masked := true
	if s != nil && s.maskAt == len(s.tokens) {
		m, masked = &s.mask, s.masked
	} else {
		m.Reset()
		if proc != nil {
			mk, isMasker := proc.(sampler.Masker)
			masked = isMasker && mk.Mask(gen, m)
		}
	}
	ok := masked
	if rp := par.RepetitionPenalty; rp > 0 && rp != 1 {
		ok = false // the penalty reads the prompt and history per token
	}
	if len(m.Exclude) > forward.MaxDrawExclude {
		ok = false
	}
	if par.TopK > 0 && par.TopP > 0 && par.TopP < 1 {
		// The host cuts top-p within the top-k mass (as HF and vLLM do);
		// DrawRow's one-candidate nucleus test takes top-p of the whole
		// mass, which can keep more. Rare; keep the host's semantics.
		ok = false
	}
	mi := int32(-1)
	if ok && !m.Forced && m.Allowed != nil {
		mi, ok = e.maskIndex(m.Allowed)
	}
	if !ok {
		p.tasks = append(p.tasks, taskHost)
		if ids := m.Peek; !masked && len(ids) > 0 && len(ids) <= maxPeek && p.hostIdx[row] != markHost {
			// The samples of a request that forks plan one after another
			// on the same row and often peek the same ids (couplet's
			// forced 横批 samples share one pool): the first one's draws
			// serve them all.
			if n := len(p.peeks); n > 0 && p.peeks[n-1].row == row && e.samePeek(p.peeks[n-1], ids) {
				e.peekShared++
				return
			}
			d0 := len(p.draws)
			for _, id := range ids {
				if id >= 0 && int(id) < e.vocab {
					p.draws = append(p.draws, forward.Draw{Row: row, Force: id, Mask: -1})
				}
			}
			p.peeks = append(p.peeks, peek{row: row, d0: d0, d1: len(p.draws)})
			p.hostIdx[row] = markPeek
			return
		}
		p.hostIdx[row] = markHost // planDraws numbers the marked rows
		return
	}
	if m.Forced && (m.Force < 0 || int(m.Force) >= e.vocab) {
		p.tasks = append(p.tasks, taskDead)
		return
	}
	d := forward.Draw{Row: row, Force: -1, Mask: mi, Temperature: par.Temperature, TopP: par.TopP, MinP: par.MinP, TopK: int32(par.TopK)}
	if m.Forced {
		d.Force = m.Force
	} else if len(m.Exclude) > 0 {
		lo := len(p.excl)
		p.excl = append(p.excl, m.Exclude...)
		d.Exclude = p.excl[lo:len(p.excl):len(p.excl)]
	}
	if par.Temperature != 0 {
		d.U = samp.Uniform()
	}
	p.tasks = append(p.tasks, int32(len(p.draws)))
	p.draws = append(p.draws, d)
}

// samePeek reports whether pk's draws gather exactly ids (those inside the
// vocabulary, in order).
func (e *Paged) samePeek(pk peek, ids []int32) bool {
	d := pk.d0
	for _, id := range ids {
		if id < 0 || int(id) >= e.vocab {
			continue
		}
		if d >= pk.d1 || e.dp.draws[d].Force != id {
			return false
		}
		d++
	}
	return d == pk.d1
}

// maskIndex returns set's index on the backend, registering it the first
// time; false if the backend refuses it (the task then goes the host way).
func (e *Paged) maskIndex(set *sampler.IDSet) (int32, bool) {
	if i, ok := e.drawMasks[set]; ok {
		return i, i >= 0
	}
	if e.drawMasks == nil {
		e.drawMasks = map[*sampler.IDSet]int32{}
	}
	i, err := e.db.RegisterMask(set.Bits())
	if err != nil {
		i = -1 // refused: remembered, never asked again
	}
	e.drawMasks[set] = i
	return i, i >= 0
}

// sampleState returns the Sampler and processor of sample i of r: the
// prompt sequence's for i == 0, else made now and kept for fork (whose
// newSeq takes them), so that the plan can take their first draw's U.
func (e *Paged) sampleState(r *request, i int) (*sampler.Sampler, sampler.LogitsProcessor) {
	if i == 0 {
		return r.seqs[0].samp, r.seqs[0].proc
	}
	if len(r.pre) < r.n {
		r.pre = make([]preSample, r.n)
	}
	ps := &r.pre[i]
	if ps.samp == nil {
		ps.samp = sampler.New(r.req.Params, i)
		if r.req.NewProcessor != nil {
			ps.proc = r.req.NewProcessor(i)
		}
	}
	return ps.samp, ps.proc
}

// preSample is a sample's state made before its sequence exists.
type preSample struct {
	samp *sampler.Sampler
	proc sampler.LogitsProcessor
}

// hostLogits is where the copied rows go in the stepBuf's logits: after
// the peeked rows.
func (e *Paged) hostLogits() []float32 {
	P, V := len(e.dp.peekRows), e.vocab
	return e.logits[P*V : (P+len(e.dp.hostRows))*V]
}

// fillPeekRows makes the host rows of peekRows (the first rows of
// logits): -Inf, then the peeked logits (rows that are also copied whole
// already hold them). Only rows past peekClean are filled; clearPeekRows
// puts the peeked entries back to -Inf after sampling.
func (e *Paged) fillPeekRows(logits []float32) {
	p, V := &e.dp, e.vocab
	P := len(p.peekRows)
	if len(p.hostRows) > 0 {
		p.peekClean = min(p.peekClean, P) // the copied rows overwrote what follows
	}
	for k := p.peekClean; k < P; k++ {
		sampler.FillNegInf(logits[k*V : (k+1)*V])
	}
	p.peekClean = max(p.peekClean, P)
	e.setPeeks(logits, false)
}

// clearPeekRows undoes fillPeekRows' writes of peeked logits, so that the
// peeked rows are -Inf everywhere again (the samplers only read them).
func (e *Paged) clearPeekRows(logits []float32) { e.setPeeks(logits, true) }

func (e *Paged) setPeeks(logits []float32, clear bool) {
	p, V := &e.dp, e.vocab
	P := len(p.peekRows)
	for _, pk := range p.peeks {
		h := int(p.hostIdx[pk.row])
		if h >= P {
			continue // copied whole
		}
		row := logits[h*V : (h+1)*V]
		for d := pk.d0; d < pk.d1; d++ {
			v := p.drawn[d].Logit
			if clear {
				v = negInf32
			}
			row[p.draws[d].Force] = v
		}
	}
}

// resolveDraws fills the step's tasks from the device draws and samples
// the host tasks from the copied rows (consume's phase 2 on this path).
// lse is [rows] (the backend's log-sum-exps); logits holds the host rows.
func (e *Paged) resolveDraws(logits []float32, lse []float64, rows int) {
	p, rs := &e.dp, &e.rs
	p.hostTasks = p.hostTasks[:0]
	for i := range rs.tasks {
		t := &rs.tasks[i]
		switch d := p.tasks[t.plan]; {
		case d == taskDead:
			t.err = sampler.ErrDeadEnd
		case d == taskHost:
			ht := *t
			ht.row, ht.plan = p.hostIdx[t.row], int32(i)
			p.hostTasks = append(p.hostTasks, ht)
		default:
			dr, got := &p.draws[d], p.drawn[d]
			t.err = nil
			if got.Tok < 0 || (dr.Force >= 0 && !(got.Logit > negInf32)) {
				t.err = sampler.ErrDeadEnd
				continue
			}
			t.tok, t.lp = got.Tok, float32(float64(got.Logit)-lse[t.row])
		}
	}
	if len(p.hostTasks) == 0 {
		return
	}
	e.fillPeekRows(logits)
	// rowSampler wants its tasks in row order; peeked rows are numbered
	// before the copied ones, so renumbering broke it.
	slices.SortStableFunc(p.hostTasks, func(a, b sampleTask) int { return cmp.Compare(a.row, b.row) })
	P, H := len(p.peekRows), len(p.hostRows)+len(p.peekRows)
	if cap(p.hostLSE) < H {
		p.hostLSE = make([]float64, H)
	}
	hl := p.hostLSE[:H]
	for k, row := range p.peekRows {
		hl[k] = lse[row]
	}
	for k, row := range p.hostRows {
		hl[P+k] = lse[row]
	}
	all := rs.tasks
	rs.tasks = p.hostTasks
	rs.run(logits, e.vocab, H, hl, e.samplingWorkers(len(p.hostTasks)))
	rs.tasks = all
	e.clearPeekRows(logits)
	for k := range p.hostTasks {
		ht := &p.hostTasks[k]
		t := &all[ht.plan]
		t.tok, t.lp, t.err = ht.tok, ht.lp, ht.err
	}
}
