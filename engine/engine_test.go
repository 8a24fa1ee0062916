package engine

import (
	"chunlian/internal/testenv"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"chunlian/forward"
	"chunlian/forward/forwardtest"
	"chunlian/kernels/cpu"
	"chunlian/sampler"
)

// genRequests makes k pseudo-random requests over a vocabulary of size
// vocab. Half of the prompts extend a shared base so prefix caching and
// chunking interact; sampling requests carry fixed seeds.
func genRequests(seed uint64, k, vocab int, maxPrompt, maxTokens int) []*Request {
	r := rand.New(rand.NewPCG(seed, 1))
	base := make([]int32, maxPrompt)
	for i := range base {
		base[i] = int32(r.IntN(vocab))
	}
	var reqs []*Request
	for i := 0; i < k; i++ {
		n := 1 + r.IntN(maxPrompt)
		prompt := make([]int32, n)
		for j := range prompt {
			prompt[j] = int32(r.IntN(vocab))
		}
		if r.IntN(2) == 0 {
			copy(prompt, base[:r.IntN(n+1)])
		}
		p := sampler.Params{MaxTokens: r.IntN(maxTokens + 1), N: 1 + r.IntN(3), Seed: r.Uint64() | 1}
		if r.IntN(2) == 0 {
			p.Temperature = 0.7 + r.Float32()
			p.TopP = 0.9
			p.TopK = r.IntN(6)
		}
		if r.IntN(3) == 0 {
			p.StopTokens = []int32{int32(r.IntN(vocab))}
		}
		if r.IntN(4) == 0 {
			p.RepetitionPenalty = 1.3
		}
		reqs = append(reqs, &Request{ID: fmt.Sprint(i), Prompt: prompt, Params: p, PromptLogProbs: r.IntN(4) == 0})
	}
	return reqs
}

// runConcurrent submits all requests at once and returns results by index.
func runConcurrent(t *testing.T, e Engine, reqs []*Request) []*Result {
	t.Helper()
	res := make([]*Result, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, rq := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = e.Generate(context.Background(), rq)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return res
}

func sameResult(a, b *Result) error {
	if len(a.Completions) != len(b.Completions) {
		return fmt.Errorf("%d vs %d completions", len(a.Completions), len(b.Completions))
	}
	for i := range a.Completions {
		ca, cb := a.Completions[i], b.Completions[i]
		if ca.Index != i || cb.Index != i {
			return fmt.Errorf("completion %d has index %d / %d", i, ca.Index, cb.Index)
		}
		if !slices.Equal(ca.Tokens, cb.Tokens) || ca.Finish != cb.Finish || !slices.Equal(ca.LogProbs, cb.LogProbs) {
			return fmt.Errorf("sample %d: %v %s vs %v %s", i, ca.Tokens, ca.Finish, cb.Tokens, cb.Finish)
		}
	}
	if !slices.Equal(a.PromptLogProbs, b.PromptLogProbs) {
		return fmt.Errorf("prompt logprobs %v vs %v", a.PromptLogProbs, b.PromptLogProbs)
	}
	if a.PromptTokens != b.PromptTokens {
		return fmt.Errorf("prompt tokens %d vs %d", a.PromptTokens, b.PromptTokens)
	}
	return nil
}

// checkDrained closes e and verifies that every block is back in the pool
// and the manager's invariants hold. After Close the loop has exited, so the
// test goroutine may read the loop-owned manager.
func checkDrained(t *testing.T, e *Paged) {
	t.Helper()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.mgr.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if n := e.mgr.NumSeqs(); n != 0 {
		t.Fatalf("%d sequences left in the block manager", n)
	}
	// Every sequence ID handed out is free again, once.
	ids := slices.Clone(e.freeIDs)
	slices.Sort(ids)
	if len(ids) != int(e.nextID) || len(slices.Compact(ids)) != len(e.freeIDs) {
		t.Fatalf("free sequence IDs %v after drain, want each of 1..%d once", e.freeIDs, e.nextID)
	}
	if free, all := e.mgr.Pool().NumFree(), e.mgr.Pool().NumBlocks(); free != all {
		t.Fatalf("%d of %d blocks free after all requests ended", free, all)
	}
	if st := e.Stats(); st.KVBlocksUsed != 0 || st.Running != 0 || st.Waiting != 0 {
		t.Fatalf("stats after drain: %+v", st)
	}
}

// TestMatchesNaive is the main correctness test: many requests submitted at
// once to the continuous-batching engine must give exactly the naive
// engine's results (greedy and seeded sampling, n > 1, stop tokens, prompt
// log-probs) whatever the chunking, cache size, preemptions and prefix hits.
// engineCases are the cache sizes and configurations the engine's
// equivalence tests run (TestMatchesNaive; TestDeviceDrawsGreedyMatchHost).
var engineCases = []struct {
	name      string
	blocks    int
	bs        int
	cfg       Config
	seed      uint64
	k         int
	preempted bool // expect preemptions
}{
	{"defaults", 512, 4, Config{}, 1, 24, false},
	{"chunked prefill", 512, 4, Config{MaxNumBatchedTokens: 7, EnablePrefixCaching: true}, 2, 24, false},
	{"few seqs per step", 512, 8, Config{MaxNumSeqs: 3, EnablePrefixCaching: true}, 3, 24, false},
	{"no prefix caching", 512, 4, Config{MaxNumSeqs: 64}, 4, 24, false},
	{"one seq per step", 512, 4, Config{MaxNumSeqs: 1, EnablePrefixCaching: true}, 8, 12, false},
	{"block size 1", 2048, 1, Config{MaxNumBatchedTokens: 16, EnablePrefixCaching: true}, 5, 16, false},
	{"tiny cache preempts", 20, 4, Config{MaxNumBatchedTokens: 64, EnablePrefixCaching: true}, 6, 24, true},
	{"tiny cache no caching", 18, 4, Config{MaxNumBatchedTokens: 9, MaxNumSeqs: 8}, 7, 24, true},
}

func TestMatchesNaive(t *testing.T) {
	const vocab = 24
	for _, tc := range engineCases {
		t.Run(tc.name, func(t *testing.T) {
			reqs := genRequests(tc.seed, tc.k, vocab, 30, 40)
			naive := NewNaive(newFake(tc.blocks, tc.bs, vocab))
			want := runConcurrent(t, naive, reqs)
			fb := newFake(tc.blocks, tc.bs, vocab)
			e, err := New(fb, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := runConcurrent(t, e, reqs)
			for i := range reqs {
				if err := sameResult(got[i], want[i]); err != nil {
					t.Errorf("request %d (prompt %d tokens, %+v): %v", i, len(reqs[i].Prompt), reqs[i].Params, err)
				}
			}
			st := e.Stats()
			if tc.preempted && st.Preemptions == 0 {
				t.Errorf("expected preemptions with %d blocks, stats %+v", tc.blocks, st)
			}
			if st.GenTokens == 0 || st.Steps == 0 {
				t.Errorf("stats not counting: %+v", st)
			}
			checkDrained(t, e)
		})
	}
}

// TestSequenceIDsReused: requests one after another reuse the IDs of the
// finished ones, so the KV manager's per-sequence slice stays as small as
// the peak number of live sequences.
func TestSequenceIDsReused(t *testing.T) {
	const vocab = 24
	e, err := New(newFake(64, 4, vocab), Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i, rq := range genRequests(3, 12, vocab, 10, 8) {
		rq.Params.N = 3
		if _, err := e.Generate(context.Background(), rq); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	checkDrained(t, e)
	if e.nextID > 3 {
		t.Errorf("12 requests of 3 samples, one at a time, used %d sequence IDs; want 3", e.nextID)
	}
}

// TestParallelSamplingSharesPrompt checks that n samples share the prompt's
// blocks (fewer blocks than n private copies) and copy the partial block.
func TestParallelSamplingSharesPrompt(t *testing.T) {
	const vocab, bs = 24, 4
	fb := newFake(256, bs, vocab)
	var peak int
	e, err := New(fb, Config{EnablePrefixCaching: true, MaxNumSeqs: 16})
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10} // 2 full blocks + 2 tokens
	req := &Request{Prompt: prompt, Params: sampler.Params{Temperature: 1, Seed: 42, N: 4, MaxTokens: 1}}
	req.OnEvent = func(ev Event) {
		// Runs on the engine goroutine: after the first sampled token the
		// 4 samples exist and own their blocks.
		if !ev.Done {
			peak = max(peak, e.mgr.Pool().NumBlocks()-e.mgr.Pool().NumFree())
		}
	}
	res, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Completions) != 4 {
		t.Fatalf("%d completions", len(res.Completions))
	}
	// Shared: 3 prompt blocks once. Private copies would need 4×3 = 12.
	if peak != 3 {
		t.Errorf("blocks in use right after the fork: %d, want 3 (prompt shared)", peak)
	}
	// A second request with 2 tokens each. Its prompt finds the first one's
	// partial last block (2 tokens, cached when its last sample left) and
	// takes a copy of it (1 copy, 9 of 10 prompt tokens cached); then
	// decoding into the shared partial block must copy it for all but one
	// sample (3 copies).
	req2 := &Request{Prompt: prompt, Params: sampler.Params{Temperature: 1, Seed: 43, N: 4, MaxTokens: 3}}
	res2a, err := e.Generate(context.Background(), req2)
	if err != nil {
		t.Fatal(err)
	}
	fb.mu.Lock()
	copies := fb.copies
	fb.mu.Unlock()
	if copies != 4 || res2a.CachedTokens != 9 {
		t.Errorf("copies: %d, want 4 (1 of the cached partial block + 3 copy-on-write); cached tokens %d, want 9", copies, res2a.CachedTokens)
	}
	// Distinct seeds per sample: with temperature 1 over 24 tokens, four
	// samples of three tokens all equal would be a bug (prob ~ 1e-12).
	res2, _ := e.Generate(context.Background(), &Request{Prompt: prompt, Params: sampler.Params{Temperature: 1, Seed: 44, N: 4, MaxTokens: 8}})
	allSame := true
	for _, c := range res2.Completions[1:] {
		allSame = allSame && slices.Equal(c.Tokens, res2.Completions[0].Tokens)
	}
	if allSame {
		t.Errorf("all samples identical: %v", res2.Completions)
	}
	checkDrained(t, e)
}

func TestPrefixCacheHits(t *testing.T) {
	const vocab, bs = 24, 4
	cases := []struct {
		name       string
		promptLen  int
		caching    bool
		wantCached int
	}{
		// The last prompt token is recomputed for its logits, from a
		// copy of the cached block that holds it.
		{"aligned", 16, true, 15},
		// The first request's last block holds prompt token 16 and the
		// generated ones: no cached block starts with 16, 17, 18 alone.
		{"unaligned", 19, true, 16},
		// The prompt's block was snapshot when its prefill ended.
		{"shorter than a block", 3, true, 2},
		{"off", 19, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(newFake(64, bs, vocab), Config{EnablePrefixCaching: tc.caching, MaxQueue: 4})
			if err != nil {
				t.Fatal(err)
			}
			prompt := make([]int32, tc.promptLen)
			for i := range prompt {
				prompt[i] = int32(i % vocab)
			}
			req := &Request{Prompt: prompt, Params: sampler.Params{MaxTokens: 3}}
			first, err := e.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			second, err := e.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if first.CachedTokens != 0 || second.CachedTokens != tc.wantCached {
				t.Errorf("cached tokens %d then %d, want 0 then %d", first.CachedTokens, second.CachedTokens, tc.wantCached)
			}
			if err := sameResult(first, second); err != nil {
				t.Errorf("cache hit changed the output: %v", err)
			}
			st := e.Stats()
			wantQ := int64(0)
			if tc.caching {
				wantQ = int64(2 * tc.promptLen)
			}
			if st.PrefixQueries != wantQ || st.PrefixHits != int64(tc.wantCached) {
				t.Errorf("prefix queries/hits %d/%d, want %d/%d", st.PrefixQueries, st.PrefixHits, wantQ, tc.wantCached)
			}
			checkDrained(t, e)
		})
	}
}

// TestFinalRegistersPromptOnly: a request's generated tokens are found by
// a later request that extends them, unless it was Final; its prompt is
// found either way.
func TestFinalRegistersPromptOnly(t *testing.T) {
	const vocab, bs = 24, 4
	for _, final := range []bool{false, true} {
		t.Run(fmt.Sprintf("final=%v", final), func(t *testing.T) {
			e, err := New(newFake(64, bs, vocab), Config{EnablePrefixCaching: true, MaxQueue: 4})
			if err != nil {
				t.Fatal(err)
			}
			prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8}
			first, err := e.Generate(context.Background(), &Request{Prompt: prompt, Final: final, Params: sampler.Params{MaxTokens: 9}})
			if err != nil {
				t.Fatal(err)
			}
			more := append(slices.Clone(prompt), first.Completions[0].Tokens...)
			second, err := e.Generate(context.Background(), &Request{Prompt: more, Params: sampler.Params{MaxTokens: 1}})
			if err != nil {
				t.Fatal(err)
			}
			// 17 tokens: the first 16 were computed (the last generated
			// one never is), four full blocks.
			want := 16
			if final {
				want = len(prompt)
			}
			if second.CachedTokens != want {
				t.Errorf("second request found %d tokens cached, want %d", second.CachedTokens, want)
			}
			checkDrained(t, e)
		})
	}
}

// TestCancelFreesBlocks cancels a request in the middle of decoding.
func TestCancelFreesBlocks(t *testing.T) {
	e, err := New(newFake(64, 4, 24), Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var events []Event
	req := &Request{Prompt: []int32{1, 2, 3, 4, 5}, Params: sampler.Params{MaxTokens: 200, N: 2},
		OnEvent: func(ev Event) {
			events = append(events, ev)
			if len(events) == 5 {
				cancel() // from the engine goroutine; the abort lands next step
			}
		}}
	_, err = e.Generate(ctx, req)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if st := e.Stats(); st.KVBlocksUsed != 0 || st.Running != 0 {
		t.Errorf("after cancel: %+v", st)
	}
	aborts := 0
	for _, ev := range events {
		if ev.Done && ev.Finish == FinishAbort {
			aborts++
		}
	}
	if aborts != 2 {
		t.Errorf("%d abort events, want 2 (one per sample)", aborts)
	}
	// An already cancelled context never reaches the queue.
	if _, err := e.Generate(ctx, req); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
	checkDrained(t, e)
}

// TestQueueFull holds the engine inside a forward pass so that requests pile
// up in the queue: beyond MaxQueue a request is refused; follow-ups are
// neither refused nor counted, so they crowd out no first request.
func TestQueueFull(t *testing.T) {
	fb := newFake(64, 4, 24)
	fb.gate = make(chan struct{})
	fb.entered = make(chan struct{}, 1)
	e, err := New(fb, Config{MaxQueue: 2, EnablePrefixCaching: true})
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Prompt: []int32{1, 2, 3}, Params: sampler.Params{MaxTokens: 2}}
	follow := *req
	follow.FollowUp = true
	errs := make(chan error, 8)
	gen := func(r *Request) { _, err := e.Generate(context.Background(), r); errs <- err }
	go gen(req)
	<-fb.entered // the first request is admitted and stuck in Forward
	for range 3 {
		go gen(&follow) // more than MaxQueue: the last waits to be sent
	}
	go gen(req)
	go gen(req)
	for e.queued.Load() < 2 { // wait until both are counted (no timing involved)
		time.Sleep(time.Millisecond)
	}
	if _, err := e.Generate(context.Background(), req); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third waiting request: %v, want ErrQueueFull", err)
	}
	close(fb.gate) // let everything run
	for range 6 {
		if err := <-errs; err != nil {
			t.Errorf("queued request: %v", err)
		}
	}
	checkDrained(t, e)
}

// TestNaiveQueueFull: the naive engine's bound on waiters refuses a
// request and neither refuses nor counts a follow-up, as the paged
// engine's does.
func TestNaiveQueueFull(t *testing.T) {
	e := NewNaive(newFake(64, 4, 24))
	e.maxQueue = 1
	e.sem <- struct{}{} // the backend is busy
	req := &Request{Prompt: []int32{1, 2, 3}, Params: sampler.Params{MaxTokens: 2}}
	follow := *req
	follow.FollowUp = true
	errs := make(chan error, 3)
	gen := func(r *Request) { _, err := e.Generate(context.Background(), r); errs <- err }
	go gen(&follow)
	go gen(&follow)
	go gen(req)
	for e.Stats().Waiting < 3 {
		select {
		case err := <-errs:
			t.Fatalf("a waiter returned while the backend was busy: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	if _, err := e.Generate(context.Background(), req); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("second waiting request: %v, want ErrQueueFull", err)
	}
	<-e.sem
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("waiter: %v", err)
		}
	}
}

func TestCloseFailsPending(t *testing.T) {
	for _, mk := range []struct {
		name string
		new  func(forward.Backend) Engine
	}{
		{"paged", func(b forward.Backend) Engine { e, _ := New(b, Config{}); return e }},
		{"naive", func(b forward.Backend) Engine { return NewNaive(b) }},
		// Two steps in flight: Close lands the step still "on the device".
		{"paged, device draws, overlap", func(b forward.Backend) Engine {
			cfg := DefaultConfig()
			cfg.OverlapMinSeqs = 2
			e, _ := New(forwardtest.HostDraws(b), cfg)
			return e
		}},
	} {
		t.Run(mk.name, func(t *testing.T) {
			fb := newFake(64, 4, 24)
			fb.gate = make(chan struct{})
			fb.entered = make(chan struct{}, 1)
			e := mk.new(fb)
			req := &Request{Prompt: []int32{1, 2, 3}, Params: sampler.Params{MaxTokens: 50}}
			errs := make(chan error, 3)
			for i := 0; i < 3; i++ {
				go func() { _, err := e.Generate(context.Background(), req); errs <- err }()
			}
			<-fb.entered
			closed := make(chan error)
			go func() { closed <- e.Close() }()
			// Wait until Close has flagged the engine before letting steps
			// through, so that the requests cannot simply finish first.
			switch x := e.(type) {
			case *Paged:
				<-x.quit
			case *Naive:
				<-x.closed
			}
			// Keep letting steps through until Close has returned.
			for done := false; !done; {
				select {
				case fb.gate <- struct{}{}:
				case err := <-closed:
					if err != nil {
						t.Error(err)
					}
					done = true
				}
			}
			for i := 0; i < 3; i++ {
				if err := <-errs; !errors.Is(err, ErrClosed) {
					t.Errorf("pending request: %v, want ErrClosed", err)
				}
			}
			if _, err := e.Generate(context.Background(), req); !errors.Is(err, ErrClosed) {
				t.Errorf("after Close: %v", err)
			}
			if p, ok := e.(*Paged); ok {
				checkDrained(t, p)
			}
		})
	}
}

// TestProcessorsAndStops covers dead ends, processor masks, stop tokens and
// score-only requests on both engines.
func TestProcessorsAndStops(t *testing.T) {
	const vocab = 24
	// Greedy reference output, to pick a stop token that really occurs.
	ref, err := NewNaive(newFake(64, 4, vocab)).Generate(context.Background(), &Request{Prompt: []int32{3, 1, 4}, Params: sampler.Params{MaxTokens: 12}})
	if err != nil {
		t.Fatal(err)
	}
	refToks := ref.Completions[0].Tokens
	stop := refToks[4]
	stopAt := slices.Index(refToks, stop)
	onlyEven := func(int) sampler.LogitsProcessor {
		return sampler.LogitsProcessorFunc(func(_ []int32, l []float32) error {
			for i := 1; i < len(l); i += 2 {
				l[i] = float32(negInf())
			}
			return nil
		})
	}
	deadAfter := func(k int) func(int) sampler.LogitsProcessor {
		return func(int) sampler.LogitsProcessor {
			return sampler.LogitsProcessorFunc(func(g []int32, l []float32) error {
				if len(g) >= k {
					for i := range l {
						l[i] = float32(negInf())
					}
				}
				return nil
			})
		}
	}
	cases := []struct {
		name  string
		req   Request
		check func(*Result) error
	}{
		{"stop token", Request{Prompt: []int32{3, 1, 4}, Params: sampler.Params{MaxTokens: 12, StopTokens: []int32{stop}}},
			func(r *Result) error {
				c := r.Completions[0]
				if c.Finish != FinishStop || !slices.Equal(c.Tokens, refToks[:stopAt+1]) {
					return fmt.Errorf("got %v %s, want %v stop", c.Tokens, c.Finish, refToks[:stopAt+1])
				}
				return nil
			}},
		{"length", Request{Prompt: []int32{3, 1, 4}, Params: sampler.Params{MaxTokens: 5}},
			func(r *Result) error {
				c := r.Completions[0]
				if c.Finish != FinishLength || !slices.Equal(c.Tokens, refToks[:5]) {
					return fmt.Errorf("got %v %s", c.Tokens, c.Finish)
				}
				return nil
			}},
		{"mask", Request{Prompt: []int32{3, 1, 4}, Params: sampler.Params{MaxTokens: 8, Temperature: 1, Seed: 9, N: 2}, NewProcessor: onlyEven},
			func(r *Result) error {
				for _, c := range r.Completions {
					for _, tk := range c.Tokens {
						if tk%2 != 0 {
							return fmt.Errorf("masked token %d sampled", tk)
						}
					}
				}
				return nil
			}},
		{"dead end at once", Request{Prompt: []int32{3, 1, 4}, Params: sampler.Params{MaxTokens: 8, N: 2}, NewProcessor: deadAfter(0)},
			func(r *Result) error {
				for _, c := range r.Completions {
					if c.Finish != FinishDeadEnd || len(c.Tokens) != 0 {
						return fmt.Errorf("got %v %s", c.Tokens, c.Finish)
					}
				}
				return nil
			}},
		{"dead end later", Request{Prompt: []int32{3, 1, 4}, Params: sampler.Params{MaxTokens: 8}, NewProcessor: deadAfter(3)},
			func(r *Result) error {
				c := r.Completions[0]
				if c.Finish != FinishDeadEnd || !slices.Equal(c.Tokens, refToks[:3]) {
					return fmt.Errorf("got %v %s", c.Tokens, c.Finish)
				}
				return nil
			}},
		{"score only", Request{Prompt: []int32{3, 1, 4, 1, 5}, PromptLogProbs: true, Params: sampler.Params{N: 2}},
			func(r *Result) error {
				if len(r.PromptLogProbs) != 4 || len(r.Completions) != 2 {
					return fmt.Errorf("got %d prompt logprobs, %d completions", len(r.PromptLogProbs), len(r.Completions))
				}
				// Check one value against the fake's function directly.
				row := make([]float32, vocab)
				fakeLogits([]int32{3, 1}, row)
				if want := sampler.LogProb(row, 4); r.PromptLogProbs[1] != want {
					return fmt.Errorf("prompt logprob[1] %v, want %v", r.PromptLogProbs[1], want)
				}
				for _, c := range r.Completions {
					if len(c.Tokens) != 0 || c.Finish != FinishLength {
						return fmt.Errorf("score-only completion %+v", c)
					}
				}
				return nil
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(newFake(64, 4, vocab), Config{MaxNumBatchedTokens: 2, EnablePrefixCaching: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range []Engine{NewNaive(newFake(64, 4, vocab)), p} {
				var done []Event
				req := tc.req
				req.OnEvent = func(ev Event) {
					if ev.Done {
						done = append(done, ev)
					}
				}
				res, err := e.Generate(context.Background(), &req)
				if err != nil {
					t.Fatalf("%T: %v", e, err)
				}
				if err := tc.check(res); err != nil {
					t.Errorf("%T: %v", e, err)
				}
				if len(done) != max(req.Params.N, 1) {
					t.Errorf("%T: %d done events", e, len(done))
				}
			}
			checkDrained(t, p)
		})
	}
}

func TestBadRequests(t *testing.T) {
	e, err := New(newFake(4, 4, 24), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer checkDrained(t, e)
	cases := []struct {
		name string
		req  *Request
		want error
	}{
		{"nil", nil, nil},
		{"empty prompt", &Request{Params: sampler.Params{MaxTokens: 1}}, nil},
		{"token outside vocab", &Request{Prompt: []int32{24}}, nil},
		{"negative temperature", &Request{Prompt: []int32{1}, Params: sampler.Params{Temperature: -1}}, nil},
		{"too long for the cache", &Request{Prompt: []int32{1, 2}, Params: sampler.Params{MaxTokens: 15}}, ErrTooLong},
	}
	for _, tc := range cases {
		for _, eng := range []Engine{e, NewNaive(newFake(4, 4, 24))} {
			_, err := eng.Generate(context.Background(), tc.req)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("%s (%T): err %v, want %v", tc.name, eng, err, tc.want)
			}
		}
	}
	if _, err := New(newFake(4, 4, 24), Config{BlockSize: 8}); err == nil {
		t.Error("block size mismatch accepted")
	}
	if _, err := New(newFake(4, 4, 24), Config{MaxQueue: -1}); err == nil {
		t.Error("negative MaxQueue accepted")
	}
}

func TestSeedReproducible(t *testing.T) {
	e, err := New(newFake(256, 4, 24), Config{})
	if err != nil {
		t.Fatal(err)
	}
	req := func(seed uint64) *Request {
		return &Request{Prompt: []int32{5, 6, 7}, Params: sampler.Params{Temperature: 1.2, TopP: 0.95, Seed: seed, N: 3, MaxTokens: 16}}
	}
	a := runConcurrent(t, e, []*Request{req(11), req(11), req(12)})
	if err := sameResult(a[0], a[1]); err != nil {
		t.Errorf("same seed differs: %v", err)
	}
	if sameResult(a[0], a[2]) == nil {
		t.Errorf("different seeds gave identical samples")
	}
	checkDrained(t, e)
}

// TestTimingsAndStats checks the ordering of the per-request timings (no
// thresholds) and the counters, for both engines.
func TestTimingsAndStats(t *testing.T) {
	p, err := New(newFake(64, 4, 24), Config{MaxNumBatchedTokens: 3, EnablePrefixCaching: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []Engine{p, NewNaive(newFake(64, 4, 24))} {
		req := &Request{Prompt: []int32{1, 2, 3, 4, 5, 6, 7}, Params: sampler.Params{MaxTokens: 6, N: 2}}
		res, err := e.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		tm := res.Timings
		if tm.Queue < 0 || tm.Prefill < 0 || tm.Decode < 0 || tm.FirstToken < tm.Queue+tm.Prefill || tm.Total < tm.FirstToken+tm.Decode {
			t.Errorf("%T: inconsistent timings %+v", e, tm)
		}
		st := e.Stats()
		if st.GenTokens != 12 || st.PromptTokens != 7 || st.KVBlocksTotal != 64 {
			t.Errorf("%T: stats %+v", e, st)
		}
		// Rows through the model: the paged engine runs the prompt once
		// and the 5 fed-back tokens once (the two greedy samples are the
		// same, so the second rides the first's rows: sequence.host); the
		// naive one reruns each sample's whole sequence: Σ_{L=7..12} L
		// per sample.
		wantRows := map[bool]int64{true: 7 + 5, false: 2 * (7 + 8 + 9 + 10 + 11 + 12)}[e == Engine(p)]
		if st.ComputedTokens != wantRows || int64(res.ComputedTokens) != wantRows {
			t.Errorf("%T: computed tokens %d (the request's %d), want %d", e, st.ComputedTokens, res.ComputedTokens, wantRows)
		}
		if ph := st.StepSeconds; e == Engine(p) && (ph.Schedule <= 0 || ph.Forward <= 0 || ph.Consume <= 0) {
			t.Errorf("step phase times %+v", ph)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if st := p.Stats(); st.Steps < 3+5 { // 7 prompt tokens in chunks of 3, then 5 decode steps
		t.Errorf("paged steps %d", st.Steps)
	}
}

// TestRandomAbortsUnderPressure mixes aborts (at a random event of a random
// request) with preemptions in a tiny cache: the survivors still match the
// naive engine and every block comes back.
func TestRandomAbortsUnderPressure(t *testing.T) {
	// Also with tokens drawn "on the device" and two steps in flight
	// (forwardtest.HostDraws, OverlapMinSeqs 2): aborts and preemptions then
	// meet sequences whose step is still on the device. Sampled tokens
	// follow the device draw's stream there, so only greedy requests are
	// compared with the naive engine.
	for _, overlap := range []bool{false, true} {
		t.Run(fmt.Sprintf("overlap %v", overlap), func(t *testing.T) { testRandomAborts(t, overlap) })
	}
}

func testRandomAborts(t *testing.T, overlap bool) {
	const vocab = 24
	aborted, preempted, overlapped := 0, int64(0), int64(0)
	for seed := uint64(10); seed < 16; seed++ {
		reqs := genRequests(seed, 20, vocab, 20, 30)
		naive := NewNaive(newFake(32, 4, vocab))
		want := runConcurrent(t, naive, reqs)
		cfg := Config{MaxNumBatchedTokens: 16, EnablePrefixCaching: seed%2 == 0}
		var b forward.Backend = newFake(20, 4, vocab)
		cd := &countDraws{}
		if overlap {
			cd.AsyncDrawBackend = forwardtest.HostDraws(b)
			b, cfg.OverlapMinSeqs = cd, 2
		}
		e, err := New(b, cfg)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(seed, 5))
		got := make([]*Result, len(reqs))
		errs := make([]error, len(reqs))
		abortAt := make([]int, len(reqs)) // 0 = never
		var wg sync.WaitGroup
		for i, rq := range reqs {
			q := *rq
			if r.IntN(3) == 0 {
				abortAt[i] = 1 + r.IntN(8)
			}
			ctx, cancel := context.WithCancel(context.Background())
			events := 0
			q.OnEvent = func(Event) {
				events++
				if events == abortAt[i] {
					cancel()
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer cancel()
				got[i], errs[i] = e.Generate(ctx, &q)
			}()
		}
		wg.Wait()
		for i := range reqs {
			switch {
			case errs[i] != nil && abortAt[i] > 0 && errors.Is(errs[i], context.Canceled):
				aborted++
			case errs[i] != nil:
				t.Errorf("seed %d request %d: %v", seed, i, errs[i])
			case overlap && reqs[i].Params.Temperature != 0: // another stream
			case overlap: // log-probs from the backend's float32 log-sum-exps
				if err := closeResult(got[i], want[i], 1e-5); err != nil {
					t.Errorf("seed %d request %d: %v", seed, i, err)
				}
			default: // finished (maybe before its abort point)
				if err := sameResult(got[i], want[i]); err != nil {
					t.Errorf("seed %d request %d: %v", seed, i, err)
				}
			}
		}
		preempted += e.Stats().Preemptions
		overlapped += cd.overlapped.Load()
		checkDrained(t, e)
	}
	if aborted == 0 || preempted == 0 || (overlap && overlapped == 0) {
		t.Errorf("the mix made %d aborts, %d preemptions, %d steps launched with another in flight; want all", aborted, preempted, overlapped)
	}
}

// TestBackendErrorFailsStepOnly: a failing forward pass fails the requests
// of that step with the backend's error, frees their blocks, and the engine
// keeps serving.
func TestBackendErrorFailsStepOnly(t *testing.T) {
	fb := newFake(64, 4, 24)
	fb.failAt = 3
	e, err := New(fb, Config{})
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Prompt: []int32{1, 2, 3}, Params: sampler.Params{MaxTokens: 10, N: 2}}
	if _, err := e.Generate(context.Background(), req); !errors.Is(err, errInjected) {
		t.Fatalf("err %v, want the backend's", err)
	}
	if st := e.Stats(); st.KVBlocksUsed != 0 {
		t.Errorf("blocks in use after the failure: %+v", st)
	}
	res, err := e.Generate(context.Background(), req)
	if err != nil || len(res.Completions) != 2 || len(res.Completions[0].Tokens) != 10 {
		t.Fatalf("after the failure: %v %+v", err, res)
	}
	checkDrained(t, e)
}

// TestMain applies CHUNLIAN_GEMM (openblas | asm | go) to the kernels, as
// the command line's --cpu-gemm does: CI runs this package's tests on each
// path (with -count=1: go test's cache does not see an environment
// read before m.Run). The library itself reads no environment.
func TestMain(m *testing.M) { testenv.Main(m, cpu.SetGEMMPath) }
