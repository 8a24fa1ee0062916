package engine

import (
	"context"
	"errors"
	"fmt"
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
	// time (in the channel or in waiting), follow-ups (Request.FollowUp)
	// aside; it bounds the queue at MaxQueue.
	queued atomic.Int64

	statsMu sync.Mutex
	stats   Stats

	// Loop-owned state below.
	mgr      *kvcache.Manager
	active   []*request      // submitted, not yet completed
	waiting  []*sequence     // admission order; preempted sequences go to the front
	running  []*sequence     // admission order: the last is the first preemption victim
	children []*sequence     // forked in this step, join running at its end
	splitBuf []*sequence     // regroup's scratch
	nextID   kvcache.SeqID   // the largest ID handed out
	freeIDs  []kvcache.SeqID // IDs of finished sequences, reused first (the KV manager indexes a slice by ID)
	// *stepBuf is the step being scheduled or consumed (its sched, batch,
	// plan, logits); bufs holds two, so that with an AsyncDrawBackend one
	// step can be on the device while the host works on the other
	// (overlapRunner). run executes the steps (runner.go).
	*stepBuf
	bufs [2]stepBuf
	run  runner
	// wake holds requests completed in this iteration; their done channels
	// are closed after publish, so that Stats already reflects their freed
	// blocks when Generate returns.
	wake []*request
	rs   rowSampler
	// db is b as a forward.DrawBackend when tokens are drawn on it (see
	// draws.go), else nil; ab is b as an AsyncDrawBackend when steps
	// overlap (overlapRunner), else nil. drawMasks: the sets registered on db.
	db        forward.DrawBackend
	ab        forward.AsyncDrawBackend
	drawMasks map[*sampler.IDSet]int32
	// peekedRows counts rows made from peeked logits instead of copied
	// (draws.go; read by tests after Close).
	peekedRows int64
	// peekShared counts peeking tasks served by the peeked draws of the
	// task before them on the same row (draws.go; read by tests).
	peekShared int64
	// usage is the last kvcache Usage, taken at usageAt (publish).
	usage   kvcache.Usage
	usageAt time.Time

	prefixQueries, prefixHits, preemptions int64
	promptTokens, genTokens, steps         int64
	computedTokens, logitRows              int64
	sampledTokens, jumpTokens              int64
	jumpMask                               sampler.Mask // jumpForward's
	phases                                 StepPhases

	// Kept samples (Request.Keep, keep.go): the cache of each, by handle,
	// and the order they were kept in (oldest first; spent handles are
	// skipped). released holds the handles Release was given, freed by
	// the loop at its next iteration (relMu guards it).
	kept      map[Handle]keptSeq
	keptOrder []Handle
	lastKept  Handle
	// keptDropped counts kept caches freed before their continuation
	// took them (Stats.KeptDropped).
	keptDropped int64
	relMu       sync.Mutex
	released    []Handle
	relWake     chan struct{} // capacity 1: Release wakes an idle loop
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
	logprobs    []float32 // raw log-probs of tokens[len(prompt):len(tokens)-pend]
	// pend counts the tokens at the end of tokens that jumpForward
	// appended and whose log-probs (and events) are still to come, from
	// the rows of the positions before them.
	pend   int
	state  seqState
	finish FinishReason
	// inflight: in a launched step not yet consumed (overlapRunner); it is
	// neither scheduled again nor preempted until then.
	inflight bool
	// adopted is the number of computed tokens of the kept sample this
	// prompt sequence took over (Request.From), 0 when none.
	adopted int
	// handle is the sequence's kept cache once it finished (Request.Keep).
	handle Handle
	// mask is what proc's Mask reported (masked) for the token after
	// tokens[:maskAt], left by jumpForward's last call on a device-draw
	// engine; 0 = none. The next step plans that very position, and no
	// Process call runs in between, so the plan takes it from here instead
	// of asking the processor twice (Masker: Mask has no side effects).
	mask   sampler.Mask
	masked bool
	maskAt int
	// maskExcl is mask.Exclude's first storage, allocated with the
	// sequence: a couplet rule excludes a few ids at most steps, and
	// growing Exclude from nil cost the engine goroutine an allocation
	// or two per sequence. Sequences are never copied by value.
	maskExcl [16]int32
	// ownSamp is samp's storage unless a device-draw plan made the
	// sampler before the sequence (one allocation fewer per sequence).
	ownSamp sampler.Sampler
	// host, when not nil, is the sequence whose rows this sample rides:
	// their tokens so far are the same, so the host's rows serve both and
	// the rider has no cache of its own (id noSeq) and is never
	// scheduled. riders are the samples riding this sequence. A rider
	// whose tokens part from its host's gets its own cache, a fork of the
	// host's (split), as does every rider of a host that finishes.
	host   *sequence
	riders []*sequence
}

// rides reports whether c is a live rider of s.
func (c *sequence) rides(s *sequence) bool { return c.host == s && c.state != stDone }

// noSeq is a rider's id: it holds no cache.
const noSeq kvcache.SeqID = -1

func (s *sequence) generated() []int32 { return s.tokens[len(s.r.req.Prompt):] }

// terminal reports that s's last token is a pending jump-forward token
// after which it ends (a stop token, or the MaxTokens-th): that token
// needs its log-prob but no K/V.
func (s *sequence) terminal() bool {
	if s.pend == 0 {
		return false
	}
	p := &s.r.req.Params
	return len(s.tokens)-len(s.r.req.Prompt) >= p.MaxTokens || slices.Contains(p.StopTokens, s.tokens[len(s.tokens)-1])
}

// want is the number of tokens of s whose K/V it needs: all of them but a
// terminal one.
func (s *sequence) want() int {
	if s.terminal() {
		return len(s.tokens) - 1
	}
	return len(s.tokens)
}

// sampleRow is the first row after en's prompt and jump-forward rows: its
// sampled row when en.sample.
func (en *entry) sampleRow() int32 {
	return int32(en.rowStart + en.plpTo - en.plpFrom + en.cfTo - en.cfFrom)
}

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
	admitted bool        // counted out of Paged.queued (unless a follow-up)
	complete bool
	plp      []float32   // prompt log-probs, [len(prompt)-1] when asked for
	plpDone  int         // plp[:plpDone] are filled
	pre      []preSample // samples ≥ 1 made before the fork by a device-draw plan (draws.go)
	cached   int
	computed int // token rows run for it (Result.ComputedTokens)

	arrival, scheduled, prefilled, firstTok, lastTok time.Time
}

// wantsPromptRows reports whether prompt positions still need logits rows.
func (r *request) wantsPromptRows() bool {
	return r.req.PromptLogProbs && r.plpDone < len(r.req.Prompt)-1
}

// entry is one sequence's share of a step.
type entry struct {
	s              *sequence
	n              int // tokens computed this step
	rowStart       int // its first row in LogitRows
	plpFrom, plpTo int // prompt positions [plpFrom, plpTo) scored this step
	// Positions [cfFrom, cfTo) score the jump-forward tokens after them
	// (see jumpForward); their rows follow the prompt rows.
	cfFrom, cfTo int
	sample       bool // its last token's row is sampled
	// Device draws (draws.go): its prompt rows' draws start at plpDraw,
	// its jump-forward rows' at cfDraw, its sampling tasks' plans at
	// planLo.
	plpDraw, cfDraw, planLo int
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
		relWake:   make(chan struct{}, 1),
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
	e.run = newRunner(e)
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
	counted := counts(req)
	if counted && e.queued.Add(1) > int64(e.cfg.MaxQueue) {
		e.queued.Add(-1)
		return nil, ErrQueueFull
	}
	// ctxDone is taken once here: the loop polls it every step
	// (reapAborted), and a receive that finds an open channel empty takes
	// no lock, where ctx.Err() takes the context's mutex.
	r := &request{req: req, ctx: ctx, ctxDone: ctx.Done(), n: n, done: make(chan struct{}), arrival: time.Now()}
	select {
	case e.submit <- r:
		// Only when follow-ups (not counted) fill the channel does this
		// wait, until the loop drains it at its next iteration.
	case <-e.quit:
		if counted {
			e.queued.Add(-1)
		}
		return nil, ErrClosed
	case <-r.ctxDone:
		if counted {
			e.queued.Add(-1)
		}
		return nil, ctx.Err()
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

// counts reports whether req counts against MaxQueue in queued: every
// request but a follow-up (Request.FollowUp).
func counts(req *Request) bool { return !req.FollowUp }

// markAdmitted counts r out of queued the first time it is admitted (or
// completes without having been); it reports whether this was that time.
func (e *Paged) markAdmitted(r *request) bool {
	if r.admitted {
		return false
	}
	r.admitted = true
	if counts(r.req) {
		e.queued.Add(-1)
	}
	return true
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
		if len(e.active) == 0 && !e.run.inFlight() {
			select {
			case r := <-e.submit:
				e.add(r)
			case <-e.relWake: // kept samples released while idle
				e.freeReleased()
				e.publishAndWake()
				continue
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
		e.freeReleased()
		e.run.iterate(e)
		e.publishAndWake()
	}
}

func (e *Paged) newSeq(r *request, index int, tokens []int32) *sequence {
	s := e.sampleSeq(r, index, tokens)
	s.id = e.takeID()
	return s
}

// newRider makes sample index of r riding host (see sequence.host).
func (e *Paged) newRider(r *request, index int, tokens []int32, host *sequence) *sequence {
	c := e.sampleSeq(r, index, tokens)
	c.id, c.host, c.numComputed = noSeq, host, host.numComputed
	host.riders = append(host.riders, c)
	return c
}

// sampleSeq is sample index of r with its Sampler and processor.
func (e *Paged) sampleSeq(r *request, index int, tokens []int32) *sequence {
	s := &sequence{r: r, index: index, tokens: tokens}
	s.mask.Exclude = s.maskExcl[:0]
	if index < len(r.pre) && r.pre[index].samp != nil { // made by a device-draw plan
		s.samp, s.proc = r.pre[index].samp, r.pre[index].proc
		return s
	}
	if r.req.NewProcessor != nil {
		s.proc = r.req.NewProcessor(index)
	}
	s.ownSamp.Init(r.req.Params, index)
	s.samp = &s.ownSamp
	return s
}

// takeID returns a finished sequence's ID, or a new one. IDs stay dense
// (at most the peak number of sequences), so the KV manager's per-sequence
// state is a slice index, not a map lookup.
func (e *Paged) takeID() kvcache.SeqID {
	if n := len(e.freeIDs); n > 0 {
		id := e.freeIDs[n-1]
		e.freeIDs = e.freeIDs[:n-1]
		return id
	}
	e.nextID++
	return e.nextID
}

// add queues a new request's prompt sequence at the back of waiting.
func (e *Paged) add(r *request) {
	prompt := r.req.Prompt
	tokens := make([]int32, len(prompt), len(prompt)+min(r.req.Params.MaxTokens, 64))
	copy(tokens, prompt)
	s := e.newSeq(r, 0, tokens)
	if r.req.From != 0 {
		e.adopt(s, r.req.From)
	}
	r.seqs = []*sequence{s}
	r.live = 1
	if r.req.PromptLogProbs {
		r.plp = make([]float32, len(prompt)-1)
	}
	if r.n == 1 {
		// A lone sample's forced first tokens (the <sep> that opens a
		// couplet's 下联 finisher) join the prompt's chunk, which confirms
		// them instead of a step drawing the first. Several samples'
		// runs may differ, and they fork only after the prompt.
		e.jumpForward(s)
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
	e.run.drain(e)
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
	for e.dropOldestKept() {
	}
	e.publishAndWake()
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
		LogitRows:        e.logitRows,
		SampledTokens:    e.sampledTokens,
		JumpTokens:       e.jumpTokens,
		Kept:             len(e.kept),
		KeptDropped:      e.keptDropped,
		StepSeconds:      e.phases,
	}
	e.statsMu.Lock()
	e.stats = st
	e.statsMu.Unlock()
}
