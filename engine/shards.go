package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// Shards spreads requests over several engines, each with its own
// backend, KV cache and loop goroutine: several host loops can drive one
// GPU (the loop's host work per row, not the device, bounds one engine
// there; several GPUs run as replicas, one process each). A request goes
// to the first engine with fewer than packBelow requests in flight, else
// to the one with the fewest (the lowest index on a tie), and stays there:
// at low load one engine's steps batch every request, which serves more
// than two engines' half-size steps contending for one device
// (docs/DECISIONS.md, "Engines per GPU").
type Shards struct {
	engines   []Engine
	inflight  []atomic.Int64
	packBelow int64
}

// PackBelow is the load (requests in flight) up to which Shards keeps
// filling its first engines before it spreads requests by load.
const PackBelow = 64

var (
	_ Engine = (*Shards)(nil)
	_ Keeper = (*Shards)(nil)
)

// NewShards returns the engines as one; it owns them (Close closes them).
func NewShards(engines ...Engine) *Shards {
	if len(engines) == 0 || len(engines) >= 1<<shardBits {
		panic(fmt.Sprintf("engine: NewShards of %d engines", len(engines)))
	}
	return &Shards{engines: engines, inflight: make([]atomic.Int64, len(engines)), packBelow: PackBelow}
}

// Len is the number of engines.
func (s *Shards) Len() int { return len(s.engines) }

// Generate runs req on the first engine below packBelow, else on the
// least busy one; a request that continues a kept sample (From) runs on
// the engine that keeps it.
func (s *Shards) Generate(ctx context.Context, req *Request) (*Result, error) {
	best := -1
	if req.From != 0 {
		if i, h, ok := s.split(req.From); ok {
			r := *req
			r.From, req, best = h, &r, i
		}
	}
	if best < 0 {
		best = s.pick()
	}
	s.inflight[best].Add(1)
	defer s.inflight[best].Add(-1)
	res, err := s.engines[best].Generate(ctx, req)
	if res != nil {
		for i := range res.Completions {
			if h := res.Completions[i].Handle; h != 0 {
				res.Completions[i].Handle = h<<shardBits | Handle(best+1)
			}
		}
	}
	return res, err
}

// A Shards handle is the engine's handle shifted left by shardBits, with
// the engine's index + 1 below (so that no handle is 0).
const shardBits = 8

// split returns the engine and engine handle of Shards handle h.
func (s *Shards) split(h Handle) (int, Handle, bool) {
	i := int(h&(1<<shardBits-1)) - 1
	if i < 0 || i >= len(s.engines) {
		return 0, 0, false
	}
	return i, h >> shardBits, true
}

// Release implements Keeper: each handle goes to the engine that keeps it.
func (s *Shards) Release(hs ...Handle) {
	for _, h := range hs {
		if i, eh, ok := s.split(h); ok {
			if k, isKeeper := s.engines[i].(Keeper); isKeeper {
				k.Release(eh)
			}
		}
	}
}

// pick chooses the engine of the next request.
func (s *Shards) pick() int {
	for i := range s.engines {
		if s.inflight[i].Load() < s.packBelow {
			return i
		}
	}
	best := 0
	for i := 1; i < len(s.engines); i++ {
		if s.inflight[i].Load() < s.inflight[best].Load() {
			best = i
		}
	}
	return best
}

// Stats sums the engines' figures (StepSeconds too: the loops run side by
// side, so their sum can exceed the wall time).
func (s *Shards) Stats() Stats {
	var t Stats
	for _, e := range s.engines {
		st := e.Stats()
		t.Running += st.Running
		t.Waiting += st.Waiting
		t.KVBlocksUsed += st.KVBlocksUsed
		t.KVBlocksTotal += st.KVBlocksTotal
		t.KVSlotsLive += st.KVSlotsLive
		t.KVSlotsAllocated += st.KVSlotsAllocated
		t.PrefixQueries += st.PrefixQueries
		t.PrefixHits += st.PrefixHits
		t.Preemptions += st.Preemptions
		t.PromptTokens += st.PromptTokens
		t.GenTokens += st.GenTokens
		t.Steps += st.Steps
		t.ComputedTokens += st.ComputedTokens
		t.LogitRows += st.LogitRows
		t.SampledTokens += st.SampledTokens
		t.JumpTokens += st.JumpTokens
		t.Kept += st.Kept
		t.KeptDropped += st.KeptDropped
		t.StepSeconds.Schedule += st.StepSeconds.Schedule
		t.StepSeconds.Forward += st.StepSeconds.Forward
		t.StepSeconds.Consume += st.StepSeconds.Consume
	}
	return t
}

// Close closes every engine.
func (s *Shards) Close() error {
	errs := make([]error, len(s.engines))
	for i, e := range s.engines {
		errs[i] = e.Close()
	}
	return errors.Join(errs...)
}
