package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"chunlian/forward"
	"chunlian/model"
	"chunlian/sampler"
)

// newRandomCPU builds the CPU backend over the tiny random test model with a
// cache of the given number of tokens.
func newRandomCPU(t testing.TB, bs, tokens int) (*forward.CPU, *model.Model) {
	t.Helper()
	m := model.NewRandom(model.TestConfig(), 1)
	b, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: bs, KVCacheBytes: int64(tokens) * forward.KVBytesPerToken(m.Config)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, m
}

func randomPrompts(seed uint64, k, vocab, maxLen int) [][]int32 {
	r := rand.New(rand.NewPCG(seed, 3))
	var ps [][]int32
	for i := 0; i < k; i++ {
		p := make([]int32, 1+r.IntN(maxLen))
		for j := range p {
			p[j] = int32(r.IntN(vocab))
		}
		ps = append(ps, p)
	}
	return ps
}

// TestRealModelMatchesNaive runs the random model through the CPU backend:
// continuous batching (mixed prefill chunks and decodes, preemptions under a
// small cache) and jump-forward (half of the requests have rules that force
// runs of tokens) must not change greedy outputs compared with the naive
// engine's full recompute, one token at a time.
func TestRealModelMatchesNaive(t *testing.T) {
	cases := []struct {
		name   string
		tokens int // cache size
		cfg    Config
	}{
		{"roomy", 4096, Config{MaxNumBatchedTokens: 64, EnablePrefixCaching: true}},
		{"tiny cache", 160, Config{MaxNumBatchedTokens: 48, EnablePrefixCaching: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nb, m := newRandomCPU(t, 4, tc.tokens)
			pb, _ := newRandomCPU(t, 4, tc.tokens)
			prompts := randomPrompts(1, 12, m.Config.VocabSize, 24)
			var reqs []*Request
			for i, p := range prompts {
				reqs = append(reqs, &Request{Prompt: p, Params: sampler.Params{MaxTokens: 16, N: 1 + i%2}, PromptLogProbs: i%3 == 0})
				if i%4 < 2 {
					reqs[i].NewProcessor = jumpRules(m.Config.VocabSize)
				}
			}
			want := runConcurrent(t, NewNaive(nb), reqs)
			e, err := New(pb, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := runConcurrent(t, e, reqs)
			for i := range reqs {
				for j, c := range got[i].Completions {
					w := want[i].Completions[j]
					if !slices.Equal(c.Tokens, w.Tokens) || c.Finish != w.Finish {
						t.Errorf("request %d sample %d: engine %v, naive %v", i, j, c.Tokens, w.Tokens)
						continue
					}
					for k := range c.LogProbs {
						if d := c.LogProbs[k] - w.LogProbs[k]; d > 1e-3 || d < -1e-3 {
							t.Errorf("request %d sample %d token %d: logprob %v vs %v", i, j, k, c.LogProbs[k], w.LogProbs[k])
						}
					}
				}
				for k := range want[i].PromptLogProbs {
					if d := got[i].PromptLogProbs[k] - want[i].PromptLogProbs[k]; d > 1e-3 || d < -1e-3 {
						t.Errorf("request %d prompt logprob %d: %v vs %v", i, k, got[i].PromptLogProbs[k], want[i].PromptLogProbs[k])
					}
				}
			}
			st := e.Stats()
			if st.JumpTokens == 0 {
				t.Error("nothing was jumped")
			}
			t.Logf("stats %+v", st)
			checkDrained(t, e)
		})
	}
}

// TestDefaultModelMatchesNaive repeats the check on the shipped model (its
// logits are peaked, unlike the random model's), skipping when the binary
// was built without it.
func TestDefaultModelMatchesNaive(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the shipped-model run")
	}
	m, err := model.Default()
	if err != nil {
		t.Skipf("default model not available: %v", err)
	}
	mk := func() *forward.CPU {
		b, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: 16, KVCacheBytes: 2048 * forward.KVBytesPerToken(m.Config)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	var reqs []*Request
	for i, p := range randomPrompts(2, 4, m.Config.VocabSize, 12) {
		reqs = append(reqs, &Request{Prompt: p, Params: sampler.Params{MaxTokens: 12, N: 1 + i%2}})
		if i%2 == 0 {
			reqs[i].NewProcessor = jumpRules(m.Config.VocabSize)
		}
	}
	want := runConcurrent(t, NewNaive(mk()), reqs)
	e, err := New(mk(), Config{MaxNumBatchedTokens: 16, EnablePrefixCaching: true})
	if err != nil {
		t.Fatal(err)
	}
	got := runConcurrent(t, e, reqs)
	for i := range reqs {
		for j, c := range got[i].Completions {
			w := want[i].Completions[j]
			if !slices.Equal(c.Tokens, w.Tokens) {
				t.Errorf("request %d sample %d: engine %v, naive %v", i, j, c.Tokens, w.Tokens)
			}
		}
	}
	if st := e.Stats(); st.JumpTokens == 0 {
		t.Error("nothing was jumped")
	}
	checkDrained(t, e)
}

func TestModelContextLimit(t *testing.T) {
	b, m := newRandomCPU(t, 4, 4096)
	max := m.Config.MaxPositions
	e, err := New(b, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer checkDrained(t, e)
	for _, eng := range []Engine{e, NewNaive(b)} {
		cases := []struct{ prompt, maxTokens int }{
			{4, max - 3},
			{max + 1, 0},
		}
		for _, tc := range cases {
			req := &Request{Prompt: make([]int32, tc.prompt), Params: sampler.Params{MaxTokens: tc.maxTokens}}
			if _, err := eng.Generate(context.Background(), req); !errors.Is(err, ErrTooLong) {
				t.Errorf("%T prompt %d + %d (model %d): %v, want ErrTooLong", eng, tc.prompt, tc.maxTokens, max, err)
			}
		}
		// Exactly the model's length is fine (not run: the check is the point).
		if err := checkLength(&Request{Prompt: make([]int32, 4), Params: sampler.Params{MaxTokens: max - 4}}, 4096, max); err != nil {
			t.Errorf("request of exactly the model's length rejected: %v", err)
		}
	}
}

// Every Stats snapshot pairs a live-slot count with the allocation it was
// counted against: live ≤ allocated at any moment under load (the ratio is
// the /metrics memory-efficiency figure).
func TestStatsLiveWithinAllocated(t *testing.T) {
	for _, bs := range []int{1, 4, 16} {
		b, m := newRandomCPU(t, bs, 4096)
		e, err := New(b, Config{MaxNumBatchedTokens: 64, EnablePrefixCaching: true})
		if err != nil {
			t.Fatal(err)
		}
		var reqs []*Request
		for i, p := range randomPrompts(uint64(bs), 48, m.Config.VocabSize, 24) {
			reqs = append(reqs, &Request{Prompt: p, Params: sampler.Params{MaxTokens: 4 + i%24, N: 1 + i%3}})
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			runConcurrent(t, e, reqs)
		}()
		seen, bad := 0, ""
		for polling := true; polling; {
			select {
			case <-done:
				polling = false
			default:
			}
			st := e.Stats()
			if st.KVSlotsLive > st.KVSlotsAllocated && bad == "" {
				bad = fmt.Sprintf("block %d: %d live slots of %d allocated", bs, st.KVSlotsLive, st.KVSlotsAllocated)
			}
			if st.KVSlotsAllocated > 0 {
				seen++
			}
		}
		if bad != "" {
			t.Error(bad)
		}
		if seen == 0 {
			t.Errorf("block %d: no snapshot under load", bs)
		}
		checkDrained(t, e)
		e.Close()
	}
}

// jumpRules gives every sample a runProc over vocab: runs of forced tokens
// (jump-forward) between masked steps.
func jumpRules(vocab int) func(int) sampler.LogitsProcessor {
	set := sampler.NewIDSet(vocab, func(id int32) bool { return id%3 != 1 })
	return func(int) sampler.LogitsProcessor { return runProc{set, vocab, -1, 0, 0} }
}
