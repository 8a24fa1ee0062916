package engine

import (
	"context"
	"slices"
	"testing"
	"time"

	"chunlian/forward/forwardtest"
	"chunlian/sampler"
)

// waitFor polls cond until it holds or a second passes (a Release is freed
// by the loop asynchronously).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestKeepAndContinue: a request continued from a kept sample (From)
// produces what the same prompt produces through the prefix cache, takes
// over every computed token of the sample, and the samples not continued
// are freed by Release; at every block size, so that the kept sample ends
// on and off a block boundary.
func TestKeepAndContinue(t *testing.T) {
	const vocab = 24
	for _, bs := range []int{1, 4, 16} {
		prompt := []int32{1, 2, 3, 4, 5, 6}
		first := &Request{Prompt: prompt, Params: sampler.Params{MaxTokens: 7, N: 3, Temperature: 1, Seed: 5}, Keep: true}
		ctx := context.Background()
		e, err := New(newFake(64, bs, vocab), Config{EnablePrefixCaching: true})
		if err != nil {
			t.Fatal(err)
		}
		a, err := e.Generate(ctx, first)
		if err != nil {
			t.Fatal(err)
		}
		var hs []Handle
		for _, c := range a.Completions {
			if c.Handle == 0 || slices.Contains(hs, c.Handle) {
				t.Fatalf("bs %d: handles %v, then %d", bs, hs, c.Handle)
			}
			hs = append(hs, c.Handle)
		}
		// Continue sample 1 with its tokens and two more.
		c1 := a.Completions[1]
		cont := append(slices.Clone(prompt), c1.Tokens...)
		cont = append(cont, 7, 8)
		next := &Request{Prompt: cont, Params: sampler.Params{MaxTokens: 5, Temperature: 1, Seed: 9}, From: hs[1]}
		b, err := e.Generate(ctx, next)
		if err != nil {
			t.Fatal(err)
		}
		// The sample's last token was drawn, never fed: every token before
		// it is taken over.
		if want := len(prompt) + len(c1.Tokens) - 1; b.CachedTokens != want {
			t.Errorf("bs %d: continued with %d cached tokens, want %d", bs, b.CachedTokens, want)
		}
		// The same prompt on a fresh engine, no handle.
		ref, err := New(newFake(64, bs, vocab), Config{EnablePrefixCaching: true})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ref.Generate(ctx, &Request{Prompt: cont, Params: next.Params})
		if err != nil {
			t.Fatal(err)
		}
		if err := sameResult(r, b); err != nil {
			t.Errorf("bs %d: continuation differs from a fresh run: %v", bs, err)
		}
		checkDrained(t, ref)
		// The continued handle is spent: From falls back to the prefix
		// cache, and releasing it does nothing.
		again, err := e.Generate(ctx, next)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameResult(again, b); err != nil {
			t.Errorf("bs %d: spent handle: %v", bs, err)
		}
		e.Release(hs...)
		waitFor(t, "the released samples' blocks", func() bool { return e.Stats().KVBlocksUsed == 0 })
		checkDrained(t, e)
	}
}

// TestKeepBounds: kept samples never outnumber MaxNumSeqs (the oldest go
// first), a failed request keeps nothing, and a request that runs short
// of blocks frees kept samples before it preempts anyone.
func TestKeepBounds(t *testing.T) {
	ctx := context.Background()
	e, err := New(newFake(16, 4, 24), Config{EnablePrefixCaching: true, MaxNumSeqs: 4})
	if err != nil {
		t.Fatal(err)
	}
	var hs []Handle
	for i := range 3 {
		res, err := e.Generate(ctx, &Request{Prompt: []int32{int32(i + 1), 2, 3}, Params: sampler.Params{MaxTokens: 2, N: 2, Temperature: 1, Seed: uint64(i + 1)}, Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range res.Completions {
			hs = append(hs, c.Handle)
		}
	}
	waitFor(t, "kept samples", func() bool { return e.Stats().Running == 0 })
	if got := len(e.kept); got > 4 {
		t.Errorf("%d samples kept, want at most MaxNumSeqs = 4", got)
	}
	if st := e.Stats(); st.Kept != 4 || st.KeptDropped != 2 {
		t.Errorf("Stats: %d kept, %d dropped; want 4 and the 2 past MaxNumSeqs", st.Kept, st.KeptDropped)
	}
	// The two oldest are gone: continuing one falls back to the cache.
	if _, ok := e.kept[hs[0]]; ok {
		t.Errorf("the oldest sample is still kept")
	}
	// 16 blocks of 4: a 54-token prompt needs 14 of them, more than the
	// kept samples leave free; without freeing them it would wait forever.
	long := make([]int32, 54)
	for i := range long {
		long[i] = int32(i % 24)
	}
	tctx, stop := context.WithTimeout(ctx, 5*time.Second)
	defer stop()
	if _, err := e.Generate(tctx, &Request{Prompt: long, Params: sampler.Params{MaxTokens: 4}}); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Preemptions != 0 || st.KeptDropped <= 2 || st.Kept >= 4 {
		t.Errorf("%d preemptions while kept samples held blocks; %d kept, %d dropped", st.Preemptions, st.Kept, st.KeptDropped)
	}
	// A request whose context ends keeps nothing.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.Generate(cctx, &Request{Prompt: []int32{5, 6, 7}, Params: sampler.Params{MaxTokens: 3}, Keep: true}); err == nil {
		t.Errorf("a cancelled request succeeded")
	}
	e.Release(hs...)
	waitFor(t, "the released samples' blocks", func() bool { return e.Stats().KVBlocksUsed == 0 })
	checkDrained(t, e)
}

// TestShardsKeep: a Shards handle names its engine, a From request runs
// there, and Release reaches it.
func TestShardsKeep(t *testing.T) {
	ctx := context.Background()
	var ps []*Paged
	var es []Engine
	for range 3 {
		p, err := New(newFake(64, 4, 24), Config{EnablePrefixCaching: true})
		if err != nil {
			t.Fatal(err)
		}
		ps, es = append(ps, p), append(es, p)
	}
	s := NewShards(es...)
	s.packBelow = 0 // least busy: the first engine
	// Hold engine 0 busy so that the kept request goes to engine 1.
	s.inflight[0].Add(1)
	prompt := []int32{3, 1, 4, 1, 5}
	a, err := s.Generate(ctx, &Request{Prompt: prompt, Params: sampler.Params{MaxTokens: 6, N: 2, Temperature: 1, Seed: 3}, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	s.inflight[0].Add(-1)
	h := a.Completions[0].Handle
	if i, _, ok := s.split(h); !ok || i != 1 {
		t.Fatalf("handle %#x names engine %d (ok %v), want 1", h, i, ok)
	}
	cont := append(slices.Clone(prompt), a.Completions[0].Tokens...)
	b, err := s.Generate(ctx, &Request{Prompt: cont, Params: sampler.Params{MaxTokens: 2}, From: h})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(cont) - 1; b.CachedTokens != want {
		t.Errorf("continued through Shards with %d cached tokens, want %d", b.CachedTokens, want)
	}
	s.Release(a.Completions[1].Handle, 0, 1<<shardBits|9) // unknown engines are ignored
	waitFor(t, "the released sample's blocks", func() bool { return ps[1].Stats().KVBlocksUsed == 0 })
	for _, p := range ps {
		checkDrained(t, p)
	}
}

// TestKeptMatchesNaive: in every engine configuration of TestMatchesNaive
// (chunked prefill, one-token blocks, a cache small enough to preempt),
// kept requests give what the naive engine gives, and so do their
// continuations: half the samples are continued through their handles
// with a few more prompt tokens, concurrently, the others released.
func TestKeptMatchesNaive(t *testing.T) {
	const vocab = 24
	for _, tc := range engineCases {
		t.Run(tc.name, func(t *testing.T) {
			reqs := genRequests(tc.seed, tc.k, vocab, 20, 12)
			for _, rq := range reqs {
				rq.Keep = true
			}
			naive := NewNaive(newFake(tc.blocks, tc.bs, vocab))
			e, err := New(newFake(tc.blocks, tc.bs, vocab), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := runConcurrent(t, e, reqs)
			want := runConcurrent(t, naive, reqs)
			for i, res := range got {
				if err := sameResult(res, want[i]); err != nil {
					t.Errorf("request %d: %v", i, err)
				}
			}
			next, released := continueHalf(reqs, got, vocab, func(i, k int) sampler.Params {
				return sampler.Params{MaxTokens: 1 + (i+k)%5, N: 1 + k%2, Temperature: 1, Seed: uint64(i*7 + k + 1)}
			})
			e.Release(released...)
			got2 := runConcurrent(t, e, next)
			from := make([]Handle, len(next))
			for i, rq := range next {
				from[i], rq.From = rq.From, 0
			}
			want2 := runConcurrent(t, naive, next)
			for i := range next {
				if err := sameResult(got2[i], want2[i]); err != nil {
					t.Errorf("continuation %d (prompt %d tokens): %v", i, len(next[i].Prompt), err)
				}
				// Without a prefix cache and with room to keep every sample,
				// cached tokens can only come from the kept sample.
				// (Samples of a score-only request other than the first
				// were never sequences: no handle.)
				if !tc.cfg.EnablePrefixCaching && !tc.preempted && from[i] != 0 && got2[i].CachedTokens == 0 {
					t.Errorf("continuation %d took nothing over from its kept sample", i)
				}
			}
			waitFor(t, "released samples", func() bool { return e.Stats().KVBlocksUsed == 0 })
			checkDrained(t, e)
		})
	}
}

// TestKeptUnderOverlap: kept samples and their continuations with tokens
// drawn "on the device", two steps in flight and a cache small enough to
// preempt and to drop kept samples: greedy requests give the naive
// engine's tokens (log-probs within float32 rounding), and nothing is
// left held.
func TestKeptUnderOverlap(t *testing.T) {
	const vocab = 24
	overlapped, preempted := int64(0), int64(0)
	for seed := uint64(20); seed < 26; seed++ {
		reqs := genRequests(seed, 16, vocab, 16, 12)
		for _, rq := range reqs {
			rq.Keep = true
			rq.Params.Temperature = 0 // the device's draws follow another stream
			// Greedy samples would ride one sequence all the way; a first
			// token of their own makes each request several sequences,
			// so that two steps can be in flight whatever the scheduling.
			rq.NewProcessor = func(i int) sampler.LogitsProcessor { return firstToken(int32(3 + 5*i%vocab)) }
		}
		naive := NewNaive(newFake(64, 4, vocab))
		cd := &countDraws{AsyncDrawBackend: forwardtest.HostDraws(newFake(28, 4, vocab))}
		e, err := New(cd, Config{MaxNumBatchedTokens: 16, EnablePrefixCaching: seed%2 == 0, OverlapMinSeqs: 2})
		if err != nil {
			t.Fatal(err)
		}
		got := runConcurrent(t, e, reqs)
		want := runConcurrent(t, naive, reqs)
		for i, res := range got {
			if err := closeResult(res, want[i], 1e-5); err != nil {
				t.Errorf("seed %d request %d: %v", seed, i, err)
			}
		}
		next, released := continueHalf(reqs, got, vocab, func(i, k int) sampler.Params {
			return sampler.Params{MaxTokens: 1 + (i+k)%6} // greedy
		})
		e.Release(released...)
		got2 := runConcurrent(t, e, next)
		for _, rq := range next {
			rq.From = 0
		}
		want2 := runConcurrent(t, naive, next)
		for i := range next {
			if err := closeResult(got2[i], want2[i], 1e-5); err != nil {
				t.Errorf("seed %d continuation %d: %v", seed, i, err)
			}
		}
		waitFor(t, "released samples", func() bool { return e.Stats().KVBlocksUsed == 0 })
		overlapped += cd.overlapped.Load()
		preempted += e.Stats().Preemptions
		checkDrained(t, e)
	}
	if overlapped == 0 {
		t.Errorf("no step was launched with another in flight")
	}
	t.Logf("%d steps launched with another in flight, %d preemptions", overlapped, preempted)
}

// continueHalf builds continuations of half the kept samples of results
// (of reqs): each a request From the sample's handle whose prompt is the
// sample's prompt and tokens plus two more, with params(i, k) for sample
// k of request i; the other half's handles are returned to release.
func continueHalf(reqs []*Request, results []*Result, vocab int, params func(i, k int) sampler.Params) (next []*Request, released []Handle) {
	for i, res := range results {
		for k, c := range res.Completions {
			if (i+k)%2 == 1 {
				released = append(released, c.Handle)
				continue
			}
			p := append(slices.Clone(reqs[i].Prompt), c.Tokens...)
			p = append(p, int32((i+k)%vocab), int32((3*i+k)%vocab))
			next = append(next, &Request{Prompt: p, From: c.Handle, Params: params(i, k)})
		}
	}
	return next, released
}

// TestAdoptedBlocksYield: continuations waiting for a slot hold the blocks
// they took over from kept samples, and those give way when the running
// sequences need them. (Before, two 60-token requests that together did
// not fit beside them were preempted into a queue whose head could never
// be admitted, and failed as too long.)
func TestAdoptedBlocksYield(t *testing.T) {
	fb := newFake(16, 4, 24) // 64 slots
	e, err := New(fb, Config{MaxNumSeqs: 2, MaxNumBatchedTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prompt := []int32{1, 2, 3, 4}
	a, err := e.Generate(ctx, &Request{Prompt: prompt, Params: sampler.Params{MaxTokens: 8, N: 2}, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	// The two kept samples hold 5 blocks (their prompt block shared).
	fb.gate = make(chan struct{})
	// step lets the engine through one forward pass at a time until cond
	// holds of the Stats published after it.
	step := func(what string, cond func(Stats) bool) {
		t.Helper()
		for range 20 {
			st := e.Stats()
			if cond(st) {
				return
			}
			select {
			case fb.gate <- struct{}{}:
				waitFor(t, "the step's stats", func() bool { return e.Stats().Steps > st.Steps })
			case <-time.After(100 * time.Millisecond): // no step pending yet
			}
		}
		t.Fatalf("never %s: %+v", what, e.Stats())
	}
	errs := make(chan error, 4)
	for _, p := range [][]int32{{5, 6, 7, 8}, {9, 10, 11, 12}} {
		go func() {
			_, err := e.Generate(ctx, &Request{Prompt: p, Params: sampler.Params{MaxTokens: 56}})
			errs <- err
		}()
	}
	step("both long requests running", func(s Stats) bool { return s.Running == 2 })
	for _, c := range a.Completions {
		cont := append(append(slices.Clone(prompt), c.Tokens...), 13)
		go func() {
			_, err := e.Generate(ctx, &Request{Prompt: cont, Params: sampler.Params{MaxTokens: 1}, From: c.Handle})
			errs <- err
		}()
	}
	step("both continuations waiting", func(s Stats) bool { return s.Waiting == 2 })
	close(fb.gate)
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	checkDrained(t, e)
}

// firstToken forces a sample's first token and leaves the others free.
type firstToken int32

func (f firstToken) Mask(gen []int32, m *sampler.Mask) bool {
	m.Reset()
	if len(gen) == 0 {
		m.Forced, m.Force = true, int32(f)
	}
	return true
}

func (f firstToken) Process(gen []int32, row []float32) error {
	var m sampler.Mask
	f.Mask(gen, &m)
	return m.Apply(row)
}
