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
	"chunlian/sampler"
)

var _ Engine = (*Naive)(nil)

// Naive is the baseline engine, the Go twin of a "PyTorch + Flask" service:
// one request at a time, its samples one after the other, and no KV reuse —
// every step recomputes the whole sequence from position 0 into the same
// slots (block table 0,1,2,… every time) and samples the last row. It uses
// the same backend and the same Sampler as the paged engine, so for greedy
// decoding both must produce the same tokens.
//
// Ownership: the goroutine of the Generate call that holds sem owns the
// backend, the logits buffer and the batch; others wait for sem (at most
// maxQueue of them counted in queued, and any follow-ups).
type Naive struct {
	b         forward.Backend
	maxQueue  int
	sem       chan struct{} // capacity 1: the backend's lock
	closed    chan struct{}
	once      sync.Once
	queued    atomic.Int64 // waiters that count against maxQueue
	followUps atomic.Int64 // waiting follow-ups (Request.FollowUp)

	// Held with sem.
	batch  forward.Batch
	logits []float32
	table  []int32 // identity block table 0..NumBlocks-1

	statsMu sync.Mutex
	stats   Stats
}

// NewNaive returns the baseline engine over b (MaxQueue as in DefaultConfig).
// It does not own b.
func NewNaive(b forward.Backend) *Naive {
	n := &Naive{b: b, maxQueue: DefaultConfig().MaxQueue, sem: make(chan struct{}, 1), closed: make(chan struct{})}
	n.table = make([]int32, b.NumBlocks())
	for i := range n.table {
		n.table[i] = int32(i)
	}
	n.stats.KVBlocksTotal = b.NumBlocks()
	return n
}

// Stats implements Engine.
func (e *Naive) Stats() Stats {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	st := e.stats
	st.Waiting = int(e.queued.Load() + e.followUps.Load())
	return st
}

// Close implements Engine: later and waiting calls get ErrClosed, the
// running one at its next step; Close waits for it.
func (e *Naive) Close() error {
	e.once.Do(func() { close(e.closed) })
	e.sem <- struct{}{}
	<-e.sem
	return nil
}

// Generate implements Engine.
func (e *Naive) Generate(ctx context.Context, req *Request) (*Result, error) {
	n, err := checkRequest(req, e.b.VocabSize())
	if err != nil {
		return nil, err
	}
	if err := checkLength(req, e.b.NumBlocks()*e.b.BlockSize(), maxModelLen(e.b)); err != nil {
		return nil, err
	}
	select {
	case <-e.closed:
		return nil, ErrClosed
	default:
	}
	// Follow-ups wait beside the bound, as on the paged engine.
	counted := counts(req)
	q := &e.followUps
	if counted {
		q = &e.queued
	}
	if q.Add(1) > int64(e.maxQueue) && counted {
		q.Add(-1)
		return nil, ErrQueueFull
	}
	arrival := time.Now()
	select {
	case e.sem <- struct{}{}:
		q.Add(-1)
	case <-ctx.Done():
		q.Add(-1)
		return nil, ctx.Err()
	case <-e.closed:
		q.Add(-1)
		return nil, ErrClosed
	}
	defer func() { <-e.sem }()
	e.statsMu.Lock()
	e.stats.Running = 1
	e.stats.PromptTokens += int64(len(req.Prompt))
	e.statsMu.Unlock()
	defer func() {
		e.statsMu.Lock()
		e.stats.Running, e.stats.KVBlocksUsed, e.stats.KVSlotsLive, e.stats.KVSlotsAllocated = 0, 0, 0, 0
		e.statsMu.Unlock()
	}()
	return e.run(ctx, req, n, arrival)
}

// run generates the n samples of req one after the other.
func (e *Naive) run(ctx context.Context, req *Request, n int, arrival time.Time) (*Result, error) {
	res := &Result{PromptTokens: len(req.Prompt)}
	start := time.Now()
	res.Timings.Queue = start.Sub(arrival)
	var firstTok, lastTok time.Time
	emit := func(ev Event) {
		if req.OnEvent != nil {
			req.OnEvent(ev)
		}
	}
	V := e.b.VocabSize()
	for i := 0; i < n; i++ {
		c := Completion{Index: i, Tokens: []int32{}}
		tokens := slices.Clone(req.Prompt)
		samp := sampler.New(req.Params, i)
		var proc sampler.LogitsProcessor
		if req.NewProcessor != nil {
			proc = req.NewProcessor(i)
		}
		scorePrompt := i == 0 && req.PromptLogProbs
		for {
			var err error
			select {
			case <-e.closed:
				err = ErrClosed
			default:
				err = ctx.Err()
			}
			if err != nil {
				emit(Event{Index: i, Token: -1, Done: true, Finish: FinishAbort})
				for j := i + 1; j < n; j++ {
					emit(Event{Index: j, Token: -1, Done: true, Finish: FinishAbort})
				}
				return nil, err
			}
			row, err := e.forwardAll(tokens, scorePrompt, len(req.Prompt))
			if err != nil {
				return nil, fmt.Errorf("engine: naive forward: %w", err)
			}
			res.ComputedTokens += len(tokens) // the whole sequence, every step
			if scorePrompt {
				res.PromptLogProbs = make([]float32, len(req.Prompt)-1)
				for p := range res.PromptLogProbs {
					res.PromptLogProbs[p] = sampler.LogProb(e.logits[p*V:(p+1)*V], req.Prompt[p+1])
				}
				scorePrompt = false
			}
			if len(tokens) == len(req.Prompt) && i == 0 {
				res.Timings.Prefill = time.Since(start)
			}
			if req.Params.MaxTokens == 0 {
				c.Finish = FinishLength
				break
			}
			tok, lp, err := samp.Sample(row, req.Prompt, tokens[len(req.Prompt):], proc)
			if err != nil {
				if !errors.Is(err, sampler.ErrDeadEnd) {
					return nil, fmt.Errorf("engine: logits processor: %w", err)
				}
				c.Finish = FinishDeadEnd
				break
			}
			now := time.Now()
			if firstTok.IsZero() {
				firstTok = now
			}
			lastTok = now
			tokens = append(tokens, tok)
			c.Tokens = append(c.Tokens, tok)
			c.LogProbs = append(c.LogProbs, lp)
			e.statsMu.Lock()
			e.stats.GenTokens++
			e.statsMu.Unlock()
			emit(Event{Index: i, Token: tok})
			if slices.Contains(req.Params.StopTokens, tok) {
				c.Finish = FinishStop
				break
			}
			if len(c.Tokens) >= req.Params.MaxTokens {
				c.Finish = FinishLength
				break
			}
		}
		emit(Event{Index: i, Token: -1, Done: true, Finish: c.Finish})
		res.Completions = append(res.Completions, c)
	}
	if !firstTok.IsZero() {
		res.Timings.FirstToken = firstTok.Sub(arrival)
		res.Timings.Decode = lastTok.Sub(firstTok)
	}
	res.Timings.Total = time.Since(arrival)
	return res, nil
}

// forwardAll runs tokens from position 0 in slots 0..len-1 and returns the
// last row's logits; with scorePrompt it also computes rows 0..promptLen-2
// (stored first in e.logits).
func (e *Naive) forwardAll(tokens []int32, scorePrompt bool, promptLen int) ([]float32, error) {
	b := &e.batch
	L := len(tokens)
	b.Tokens = append(b.Tokens[:0], tokens...)
	b.Positions, b.SlotMapping = b.Positions[:0], b.SlotMapping[:0]
	for p := range L {
		b.Positions = append(b.Positions, int32(p))
		b.SlotMapping = append(b.SlotMapping, int32(p)) // block p/bs of the identity table
	}
	bs := e.b.BlockSize()
	nb := (L + bs - 1) / bs
	b.Seqs = append(b.Seqs[:0], forward.SeqSpan{Start: 0, Len: L, CtxLen: L, BlockTable: e.table[:nb]})
	b.LogitRows = b.LogitRows[:0]
	if scorePrompt {
		for p := 0; p < promptLen-1; p++ {
			b.LogitRows = append(b.LogitRows, p)
		}
	}
	b.LogitRows = append(b.LogitRows, L-1)
	V := e.b.VocabSize()
	rows := len(b.LogitRows)
	if cap(e.logits) < rows*V {
		e.logits = make([]float32, rows*V)
	}
	e.logits = e.logits[:rows*V]
	if err := e.b.Forward(b, e.logits); err != nil {
		return nil, err
	}
	e.statsMu.Lock()
	e.stats.Steps++
	e.stats.ComputedTokens += int64(L) // the whole sequence, every step
	e.stats.KVBlocksUsed = nb
	e.stats.KVSlotsLive, e.stats.KVSlotsAllocated = L, nb*bs
	e.statsMu.Unlock()
	return e.logits[(rows-1)*V:], nil
}
