package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"chunlian/forward"
	"chunlian/kvcache"
	"chunlian/model"
	"chunlian/sampler"
)

// ErrTooLong rejects a request whose prompt plus MaxTokens exceeds the
// model's context (max_position_embeddings, when the backend exposes its
// model) or could not fit in the whole KV cache even if it ran alone.
// Returned errors wrap it with the numbers.
var ErrTooLong = errors.New("engine: prompt + max_tokens too long")

// maxModelLen is the model's max_position_embeddings when the backend
// exposes its model (forward.CPU does), else 0 (no limit known).
func maxModelLen(b forward.Backend) int {
	if mb, ok := b.(interface{ Model() *model.Model }); ok && mb.Model() != nil {
		return mb.Model().Config.MaxPositions
	}
	return 0
}

// checkLength applies ErrTooLong for a backend with cacheTokens slots and a
// model context of maxLen positions (0 = unknown).
func checkLength(req *Request, cacheTokens, maxLen int) error {
	n := len(req.Prompt) + req.Params.MaxTokens
	if maxLen > 0 && n > maxLen {
		return fmt.Errorf("%w: %d prompt + %d new tokens exceed the model's %d positions", ErrTooLong, len(req.Prompt), req.Params.MaxTokens, maxLen)
	}
	if n > cacheTokens {
		return fmt.Errorf("%w: %d prompt + %d new tokens exceed the KV cache's %d slots", ErrTooLong, len(req.Prompt), req.Params.MaxTokens, cacheTokens)
	}
	return nil
}

var _ Engine = (*Paged)(nil)

// Paged is the continuous-batching engine over a paged KV cache. (The name
// Engine is taken by the interface it implements.)
//
// Ownership: one goroutine, the engine loop (loop), owns the scheduler
// queues, the block manager, the backend and every request and sequence
// after submission, and it calls OnEvent. Generate runs on callers'
// goroutines and only touches the submit channel, the request's done
// channel (closed by the loop after it wrote res/err, which publishes them)
// and the atomic queue counter. Stats reads a snapshot under statsMu that
// the loop rewrites after every step. The only other goroutines are the
// sampling workers of each step (rowSampler.run, the loop being one of
// them): they run the logits processors and Samplers of the sequences that
// sample, each sequence on exactly one worker, and compute row
// log-sum-exps, while the loop waits for them (see consume).
//
// Events: every generated token is sent as Event{Index, Token}; each sample
// ends with one Event{Index, Done: true, Token: -1, Finish}.
type Paged struct {
	cfg       Config
	b         forward.Backend
	vocab     int
	numBlocks int
	maxLen    int // model context in positions; 0 = unknown

	submit    chan *request // Generate → loop; capacity MaxQueue
	quit      chan struct{} // closed by Close
	stopped   chan struct{} // closed by the loop when it has exited
	closeOnce sync.Once
	// queued counts requests submitted but not yet admitted for the first
	// time (in the channel or in waiting); it bounds the queue at MaxQueue.
	queued atomic.Int64

	statsMu sync.Mutex
	stats   Stats

	// Loop-owned state below.
	mgr      *kvcache.Manager
	active   []*request  // submitted, not yet completed
	waiting  []*sequence // admission order; preempted sequences go to the front
	running  []*sequence // admission order: the last is the first preemption victim
	children []*sequence // forked in this step, join running at its end
	nextID   kvcache.SeqID
	// *stepBuf is the step being scheduled or consumed (its sched, batch,
	// plan, logits); bufs holds two, so that with an AsyncDrawBackend one
	// step can be on the device while the host works on the other (see
	// stepAsync). pend is the launched step not yet consumed, next the
	// slot the next step is scheduled into.
	*stepBuf
	bufs [2]stepBuf
	pend *stepBuf
	next int
	// wake holds requests completed in this iteration; their done channels
	// are closed after publish, so that Stats already reflects their freed
	// blocks when Generate returns.
	wake []*request
	rs   rowSampler
	// db is b as a forward.DrawBackend when tokens are drawn on it (see
	// draws.go), else nil; ab is b as an AsyncDrawBackend when steps
	// overlap (stepAsync), else nil. drawMasks: the sets registered on db.
	db        forward.DrawBackend
	ab        forward.AsyncDrawBackend
	drawMasks map[*sampler.IDSet]int32
	// peekedRows counts rows made from peeked logits instead of copied
	// (draws.go; read by tests after Close).
	peekedRows int64
	// peekShared counts Peeker tasks served by the peeked draws of the
	// task before them on the same row (draws.go; read by tests).
	peekShared int64
	// usage is the last kvcache Usage, taken at usageAt (publish).
	usage   kvcache.Usage
	usageAt time.Time

	prefixQueries, prefixHits, preemptions int64
	promptTokens, genTokens, steps         int64
	computedTokens                         int64
	phases                                 StepPhases
}

// usageEvery bounds the age of Stats' live-slot count under load.
const usageEvery = 20 * time.Millisecond

// stepBuf is one step's state from scheduling to consumption.
type stepBuf struct {
	slot   int // its AsyncDrawBackend slot (its index in bufs)
	sched  []entry
	batch  forward.Batch
	dp     drawPlan  // device draws (draws.go)
	logits []float32 // [host rows, vocab]: every row, or with device draws dp.peekRows then dp.hostRows
	lse    []float64 // [len(batch.LogitRows)] log-sum-exp of each logits row (NaN = not needed/known)
	lse32  []float32 // the backend's, with an AsyncDrawBackend
	t0     time.Time // scheduling began
}

type seqState uint8

const (
	stWaiting seqState = iota
	stRunning
	stDone
)

// sequence is one sample being generated (or, before the fork, the request's
// prompt). Owned by the loop.
type sequence struct {
	id          kvcache.SeqID
	r           *request
	index       int     // sample index
	tokens      []int32 // prompt + generated so far
	numComputed int     // tokens whose K/V are in the cache: tokens[:numComputed]
	samp        *sampler.Sampler
	proc        sampler.LogitsProcessor
	logprobs    []float32 // raw log-probs of tokens[len(prompt):]
	state       seqState
	finish      FinishReason
	// inflight: in a launched step not yet consumed (stepAsync); it is
	// neither scheduled again nor preempted until then.
	inflight bool
}

func (s *sequence) generated() []int32 { return s.tokens[len(s.r.req.Prompt):] }

// request is one Generate call. Fields are loop-owned until done is closed;
// after that, Generate reads res and err.
type request struct {
	req      *Request
	ctx      context.Context
	ctxDone  <-chan struct{} // ctx.Done(), taken once by Generate
	n        int
	done     chan struct{}
	res      *Result
	err      error
	seqs     []*sequence // by sample index; only seqs[0] until the fork
	forked   bool        // prompt fully computed once and samples forked
	live     int         // sequences not done
	admitted bool        // counted out of Paged.queued
	complete bool
	plp      []float32   // prompt log-probs, [len(prompt)-1] when asked for
	plpDone  int         // plp[:plpDone] are filled
	pre      []preSample // samples ≥ 1 made before the fork by a device-draw plan (draws.go)
	cached   int

	arrival, scheduled, prefilled, firstTok, lastTok time.Time
}

// wantsPromptRows reports whether prompt positions still need logits rows.
func (r *request) wantsPromptRows() bool {
	return r.req.PromptLogProbs && r.plpDone < len(r.req.Prompt)-1
}

// entry is one sequence's share of a step.
type entry struct {
	s              *sequence
	n              int  // tokens computed this step
	rowStart       int  // its first row in LogitRows
	plpFrom, plpTo int  // prompt positions [plpFrom, plpTo) scored this step
	sample         bool // its last token's row is sampled
	// Device draws (draws.go): its prompt rows' draws start at plpDraw,
	// its sampling tasks' plans at planLo.
	plpDraw, planLo int
	// Set by consume: its sampling tasks are rs.tasks[taskLo:taskHi] (N of
	// them the step a request forks); scoreOnly marks a MaxTokens == 0
	// request whose prompt just finished.
	taskLo, taskHi int
	scoreOnly      bool
}

// New starts an engine over b. The engine does not own b: close b after
// Close. A zero Config means DefaultConfig().
func New(b forward.Backend, cfg Config) (*Paged, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults(b.BlockSize())
	if cfg.BlockSize != b.BlockSize() {
		return nil, fmt.Errorf("engine: block size %d differs from the backend's %d", cfg.BlockSize, b.BlockSize())
	}
	if b.NumBlocks() <= 0 || b.VocabSize() <= 0 {
		return nil, fmt.Errorf("engine: backend has %d blocks and vocab %d", b.NumBlocks(), b.VocabSize())
	}
	e := &Paged{
		cfg:       cfg,
		b:         b,
		vocab:     b.VocabSize(),
		numBlocks: b.NumBlocks(),
		maxLen:    maxModelLen(b),
		submit:    make(chan *request, cfg.MaxQueue),
		quit:      make(chan struct{}),
		stopped:   make(chan struct{}),
		mgr:       kvcache.NewManager(b.NumBlocks(), cfg.BlockSize, cfg.EnablePrefixCaching),
	}
	if db, ok := b.(forward.DrawBackend); ok && db.DrawVocab() {
		e.db = db
		if ab, ok := b.(forward.AsyncDrawBackend); ok {
			e.ab = ab
		}
	}
	e.bufs[1].slot = 1
	e.stepBuf = &e.bufs[0]
	e.stats.KVBlocksTotal = e.numBlocks
	go e.loop()
	return e, nil
}

// Config returns the effective configuration (defaults filled in).
func (e *Paged) Config() Config { return e.cfg }

// Generate implements Engine.
func (e *Paged) Generate(ctx context.Context, req *Request) (*Result, error) {
	n, err := checkRequest(req, e.vocab)
	if err != nil {
		return nil, err
	}
	if err := checkLength(req, e.numBlocks*e.cfg.BlockSize, e.maxLen); err != nil {
		return nil, err
	}
	select {
	case <-e.quit:
		return nil, ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if e.queued.Add(1) > int64(e.cfg.MaxQueue) {
		e.queued.Add(-1)
		return nil, ErrQueueFull
	}
	// ctxDone is taken once here: the loop polls it every step
	// (reapAborted), and a receive that finds an open channel empty takes
	// no lock, where ctx.Err() takes the context's mutex.
	r := &request{req: req, ctx: ctx, ctxDone: ctx.Done(), n: n, done: make(chan struct{}), arrival: time.Now()}
	select {
	case e.submit <- r: // never blocks: at most MaxQueue requests are counted in queued
	case <-e.quit:
		e.queued.Add(-1)
		return nil, ErrClosed
	}
	select {
	case <-r.done:
	case <-e.stopped:
		select {
		case <-r.done:
		default: // submitted after the loop's last drain
			return nil, ErrClosed
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return r.res, nil
}

// checkRequest validates req against the vocabulary and returns its N.
func checkRequest(req *Request, vocab int) (int, error) {
	if req == nil {
		return 0, errors.New("engine: nil request")
	}
	if len(req.Prompt) == 0 {
		return 0, errors.New("engine: empty prompt")
	}
	for i, t := range req.Prompt {
		if t < 0 || int(t) >= vocab {
			return 0, fmt.Errorf("engine: prompt token %d at %d outside vocab [0,%d)", t, i, vocab)
		}
	}
	if err := sampler.Validate(req.Params); err != nil {
		return 0, err
	}
	return max(req.Params.N, 1), nil
}

// Stats implements Engine; safe from any goroutine.
func (e *Paged) Stats() Stats {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	return e.stats
}

// Close implements Engine: it stops the loop, failing every pending request
// with ErrClosed, and waits for the loop to exit. It does not close the
// backend.
func (e *Paged) Close() error {
	e.closeOnce.Do(func() { close(e.quit) })
	<-e.stopped
	return nil
}

// loop is the engine goroutine; see Paged.
func (e *Paged) loop() {
	defer close(e.stopped)
	for {
		if len(e.active) == 0 && e.pend == nil {
			select {
			case r := <-e.submit:
				e.add(r)
			case <-e.quit:
				e.shutdown()
				return
			}
		}
	drain: // new requests join at this step
		for {
			select {
			case r := <-e.submit:
				e.add(r)
			default:
				break drain
			}
		}
		select {
		case <-e.quit:
			e.shutdown()
			return
		default:
		}
		e.reapAborted()
		switch {
		case e.ab != nil:
			e.stepAsync()
		case len(e.running)+len(e.waiting) > 0:
			e.step()
		}
		e.publishAndWake()
	}
}

func (e *Paged) newSeq(r *request, index int, tokens []int32) *sequence {
	e.nextID++
	if index < len(r.pre) && r.pre[index].samp != nil { // made by a device-draw plan
		ps := r.pre[index]
		return &sequence{id: e.nextID, r: r, index: index, tokens: tokens, samp: ps.samp, proc: ps.proc}
	}
	var proc sampler.LogitsProcessor
	if r.req.NewProcessor != nil {
		proc = r.req.NewProcessor(index)
	}
	return &sequence{id: e.nextID, r: r, index: index, tokens: tokens, samp: sampler.New(r.req.Params, index), proc: proc}
}

// add queues a new request's prompt sequence at the back of waiting.
func (e *Paged) add(r *request) {
	prompt := r.req.Prompt
	tokens := make([]int32, len(prompt), len(prompt)+min(r.req.Params.MaxTokens, 64))
	copy(tokens, prompt)
	s := e.newSeq(r, 0, tokens)
	r.seqs = []*sequence{s}
	r.live = 1
	if r.req.PromptLogProbs {
		r.plp = make([]float32, len(prompt)-1)
	}
	e.active = append(e.active, r)
	e.waiting = append(e.waiting, s)
}

// reapAborted fails requests whose context ended, freeing their blocks, and
// drops them from active. It runs every loop iteration, so an abort lands
// at the next step.
func (e *Paged) reapAborted() {
	failed := false
	for _, r := range e.active {
		if r.complete {
			continue
		}
		select {
		case <-r.ctxDone: // nil (never ready) for a context that cannot end
			e.fail(r, r.ctx.Err(), FinishAbort)
			failed = true
		default:
		}
	}
	if failed {
		e.compact()
	}
}

// compact drops done sequences from the queues and completed requests.
func (e *Paged) compact() {
	e.active = slices.DeleteFunc(e.active, func(r *request) bool { return r.complete })
	e.waiting = slices.DeleteFunc(e.waiting, func(s *sequence) bool { return s.state == stDone })
	e.running = slices.DeleteFunc(e.running, func(s *sequence) bool { return s.state == stDone })
}

// shutdown fails everything still pending with ErrClosed (after landing
// a step still on the device).
func (e *Paged) shutdown() {
	if p := e.pend; p != nil {
		e.pend = nil
		e.stepBuf = p
		e.landStep()
	}
	for {
		select {
		case r := <-e.submit:
			e.add(r)
			continue
		default:
		}
		break
	}
	for _, r := range e.active {
		if !r.complete {
			e.fail(r, ErrClosed, FinishAbort)
		}
	}
	e.compact()
	e.publishAndWake()
}

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

// finish ends sequence s: frees its blocks, emits its Done event (Token -1:
// every token was already sent in its own event) and completes the request
// when it was the last live sequence.
func (e *Paged) finish(s *sequence, reason FinishReason) {
	s.state = stDone
	s.finish = reason
	e.mgr.Free(s.id)
	r := s.r
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
	if !r.admitted {
		r.admitted = true
		e.queued.Add(-1)
	}
	now := time.Now()
	if r.err == nil {
		res := &Result{PromptLogProbs: r.plp, PromptTokens: len(r.req.Prompt), CachedTokens: r.cached}
		for i := 0; i < r.n; i++ {
			if i < len(r.seqs) {
				s := r.seqs[i]
				res.Completions = append(res.Completions, Completion{Index: i, Tokens: slices.Clone(s.generated()), LogProbs: s.logprobs, Finish: s.finish})
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

// publishAndWake refreshes Stats, then wakes the requests completed since
// the last call.
func (e *Paged) publishAndWake() {
	e.publish()
	for _, r := range e.wake {
		close(r.done)
	}
	clear(e.wake)
	e.wake = e.wake[:0]
}

// preempt evicts running sequence s by recompute: its blocks are freed (its
// full blocks stay findable in the prefix cache) and it goes to the front of
// waiting with nothing computed.
func (e *Paged) preempt(s *sequence) {
	e.mgr.Free(s.id)
	s.numComputed = 0
	s.state = stWaiting
	e.waiting = slices.Insert(e.waiting, 0, s)
	e.preemptions++
}

// step schedules one batch, runs it and consumes its logits (one step at
// a time; stepAsync overlaps two).
func (e *Paged) step() {
	if !e.scheduleStep() {
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

// stepAsync is one iteration with two steps in flight: schedule and
// launch a step from the sequences not in flight (on the slot not in
// use), then wait for and consume the step launched in the previous
// iteration, while the device computes the new one. Under load the
// running sequences fall into two groups that alternate; a lone request
// runs launch, land, launch, land, as step does.
func (e *Paged) stepAsync() {
	a := &e.bufs[e.next]
	e.stepBuf = a
	// Two steps in flight pay only when the host's work per step is
	// comparable to the device's: below OverlapMinSeqs sequences a second
	// group would double every sequence's device time per token, so a
	// step is launched only when none is in flight (as step does).
	load := len(e.running) + len(e.waiting)
	launched := load > 0 && (e.pend == nil || load >= e.cfg.OverlapMinSeqs) && e.launchStep()
	if p := e.pend; p != nil {
		e.pend = nil
		e.stepBuf = p
		e.landStep()
	}
	if launched {
		e.pend = a
		e.next ^= 1
	}
}

// launchStep schedules a step into the current stepBuf and launches it on
// its slot without waiting (stepAsync). It reports whether it launched.
func (e *Paged) launchStep() bool {
	if !e.scheduleStep() {
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
// consumes it (stepAsync).
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

// consumeStep takes a finished step's results (lse: [rows]) into the
// sequences.
func (e *Paged) consumeStep(lse []float64) {
	e.steps++
	e.computedTokens += int64(len(e.batch.Tokens))
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

// scheduleStep fills the current stepBuf: the scheduled entries, the flat
// batch, pending block copies sent to the backend, the device-draw plan
// and a logits buffer of the right size. It reports false when nothing
// could be scheduled.
func (e *Paged) scheduleStep() bool {
	e.t0 = time.Now()
	budget := e.cfg.MaxNumBatchedTokens
	maxSeqs := e.cfg.MaxNumSeqs
	if e.ab != nil && e.pend == nil && len(e.running) >= e.cfg.OverlapMinSeqs {
		// Nothing in flight under load: take half of the running
		// sequences, so that the other half forms the second group.
		maxSeqs = min(maxSeqs, max(1, len(e.running)/2))
	}
	e.sched = e.sched[:0]
	preempted := false

	// Running sequences first, in admission order: each gets the tokens it
	// still needs (one for a decode, the rest of its prompt for a chunked
	// prefill), within the token budget. Sequences of a step still on the
	// device (inflight) wait for their results.
running:
	for i := 0; i < len(e.running) && budget > 0 && len(e.sched) < maxSeqs; i++ {
		s := e.running[i]
		if s.inflight {
			continue
		}
		n := min(len(s.tokens)-s.numComputed, budget)
		for !e.mgr.Allocate(s.id, n, kvcache.Computed{}) {
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
				break running
			}
		}
		e.sched = append(e.sched, entry{s: s, n: n})
		budget -= n
	}

	// Then waiting ones in order (FCFS: stop at the first that does not
	// fit), unless this step had to preempt.
	for !preempted && len(e.waiting) > 0 && budget > 0 && len(e.sched) < maxSeqs && len(e.running) < maxSeqs {
		s := e.waiting[0]
		r := s.r
		var hit kvcache.Computed
		if !r.wantsPromptRows() {
			hit = e.mgr.ComputedBlocks(s.tokens)
		}
		cached := hit.Tokens(e.cfg.BlockSize)
		n := min(len(s.tokens)-cached, budget)
		if !e.mgr.Allocate(s.id, n, hit) {
			break
		}
		e.waiting = e.waiting[1:]
		s.numComputed = cached
		s.state = stRunning
		e.running = append(e.running, s)
		if !r.admitted {
			r.admitted = true
			e.queued.Add(-1)
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

	if len(e.sched) == 0 {
		if !preempted && len(e.running) == 0 && len(e.waiting) > 0 && e.pend == nil {
			// Cannot happen with Generate's size check; fail rather than spin.
			e.fail(e.waiting[0].r, ErrTooLong, FinishAbort)
			e.compact()
		}
		return false
	}

	e.buildBatch()
	if src, dst := e.mgr.TakeCopies(); len(src) > 0 {
		if err := e.b.CopyBlocks(src, dst); err != nil {
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
		e.logits = make([]float32, hostRows*e.vocab)
		e.dp.peekClean = 0
	}
	e.logits = e.logits[:hostRows*e.vocab]
	return true
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
		en.sample = s.numComputed+en.n == len(s.tokens)
		if en.sample {
			b.LogitRows = append(b.LogitRows, start+en.n-1)
		}
	}
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
	V := e.vocab
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
		e.mgr.CacheBlocks(s.id, s.tokens, s.numComputed)
		if !en.sample {
			continue
		}
		row := int32(en.rowStart + en.plpTo - en.plpFrom)
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
		}
		en.taskHi = len(rs.tasks)
	}

	if e.db != nil {
		e.resolveDraws(logits, lse, rows)
	} else {
		rs.run(logits, V, rows, lse, e.samplingWorkers(rows))
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
				v = logits[row*V+int(r.req.Prompt[p+1])]
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
		for i := en.taskLo; i < en.taskHi; i++ {
			if r.complete {
				break
			}
			e.applySample(&rs.tasks[i], now)
		}
	}
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

// samplingWorkers is the number of goroutines (the engine goroutine
// included) for a step with rows logits rows: Config.SamplingWorkers (0 =
// GOMAXPROCS), but at least minRowsPerWorker rows each, since a goroutine
// hand-off costs about as much as a fraction of one row.
func (e *Paged) samplingWorkers(rows int) int {
	w := e.cfg.SamplingWorkers
	if w == 0 {
		w = runtime.GOMAXPROCS(0)
	}
	return max(1, min(w, rows/minRowsPerWorker))
}

// fork handles the request of prompt sequence s (seqs[0]) whose prompt is
// now fully computed: score-only requests (MaxTokens == 0) report true and
// are finished by the caller after their prompt log-probs are written;
// otherwise the other N-1 samples fork off s, sharing its blocks, and
// join running at the end of the step.
func (e *Paged) fork(s *sequence, now time.Time) (scoreOnly bool) {
	r := s.r
	r.forked = true
	r.prefilled = now
	if r.req.Params.MaxTokens == 0 {
		return true
	}
	for i := 1; i < r.n; i++ {
		c := e.newSeq(r, i, slices.Clone(s.tokens))
		e.mgr.Fork(s.id, c.id)
		c.numComputed = s.numComputed
		c.state = stRunning
		r.seqs = append(r.seqs, c)
		e.children = append(e.children, c)
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
	tok := t.tok
	s.tokens = append(s.tokens, tok)
	s.logprobs = append(s.logprobs, t.lp)
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
	}
}

// publish refreshes the Stats snapshot.
func (e *Paged) publish() {
	// Usage's live-slot count walks every sequence's block table: at
	// thousands of sequences it cost the engine goroutine ~10 % of a
	// step. Under load it is refreshed every usageEvery; the block counts
	// are exact every time, and everything is exact whenever nothing runs
	// (so a drained engine's Stats are). LiveSlots and AllocatedSlots
	// always come from the same walk, so that their ratio is a real one:
	// a stale live count paired with a fresh allocation can report shares
	// far outside [0, 1].
	now := time.Now()
	if len(e.running) == 0 || now.Sub(e.usageAt) >= usageEvery {
		e.usage, e.usageAt = e.mgr.Usage(), now
	} else {
		p := e.mgr.Pool()
		e.usage.UsedBlocks = p.NumBlocks() - p.NumFree()
	}
	u := e.usage
	st := Stats{
		Running:          len(e.running),
		Waiting:          len(e.waiting) + len(e.submit),
		KVBlocksUsed:     u.UsedBlocks,
		KVBlocksTotal:    u.TotalBlocks,
		KVSlotsLive:      u.LiveSlots,
		KVSlotsAllocated: u.AllocatedSlots,
		PrefixQueries:    e.prefixQueries,
		PrefixHits:       e.prefixHits,
		Preemptions:      e.preemptions,
		PromptTokens:     e.promptTokens,
		GenTokens:        e.genTokens,
		Steps:            e.steps,
		ComputedTokens:   e.computedTokens,
		StepSeconds:      e.phases,
	}
	e.statsMu.Lock()
	e.stats = st
	e.statsMu.Unlock()
}
