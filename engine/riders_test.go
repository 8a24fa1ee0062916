package engine

import (
	"context"
	"testing"

	"chunlian/forward/forwardtest"
	"chunlian/sampler"
)

// TestRidersShareRows: samples whose tokens are still the same ride one
// sequence's rows (sequence.host): a request whose processor forces its
// first five tokens computes them once for its four samples, and every
// sample's tokens, log-probs and finish are still the naive engine's, on
// the host path and with device draws (against the host path on the
// same backend, whose log-sum-exps the draws use).
func TestRidersShareRows(t *testing.T) {
	const vocab, n, lead = 24, 4, 3 // runProc forces steps 0-4 with lead 3
	set := sampler.NewIDSet(vocab, func(id int32) bool { return id%3 != 1 })
	req := func() *Request {
		return &Request{
			Prompt:       []int32{3, 1, 4, 1, 5, 9, 2, 6},
			Params:       sampler.Params{Temperature: 1, MaxTokens: 12, N: n, Seed: 5},
			NewProcessor: func(int) sampler.LogitsProcessor { return runProc{set, vocab, -1, 100, lead} },
		}
	}
	naive, err := NewNaive(newFake(256, 4, vocab)).Generate(context.Background(), req())
	if err != nil {
		t.Fatal(err)
	}
	host, err := New(hostOnly{forwardtest.HostDraws(newFake(256, 4, vocab))}, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	onHost, err := host.Generate(context.Background(), req())
	if err != nil {
		t.Fatal(err)
	}
	checkDrained(t, host)
	for _, device := range []bool{false, true} {
		want := naive
		if device {
			want = onHost
		}
		e := drawEngine(t, 256, 4, vocab, DefaultConfig(), device)
		got, err := e.Generate(context.Background(), req())
		if err != nil {
			t.Fatal(err)
		}
		if err := sameResult(got, want); err != nil {
			t.Errorf("device %v: %v", device, err)
		}
		// Without riders each sample computes every token it feeds
		// back (all but its last); the five forced ones are computed
		// once instead of n times.
		rows := int64(len(req().Prompt)) - (n-1)*5
		for _, c := range got.Completions {
			if len(c.Tokens) <= 5 {
				t.Fatalf("device %v: sample %d ended after %d tokens", device, c.Index, len(c.Tokens))
			}
			rows += int64(len(c.Tokens) - 1)
		}
		if st := e.Stats(); st.ComputedTokens != rows || int64(got.ComputedTokens) != rows {
			t.Errorf("device %v: computed %d rows (the request's %d), want %d", device, st.ComputedTokens, got.ComputedTokens, rows)
		}
		checkDrained(t, e)
	}
}

// TestRidersMatchNaive: requests of up to six samples whose processors
// force runs that the samples share for a while (runProc with lead 3)
// and whose draws often agree (top-k 2),
// in every engine configuration (chunked prefill, prefix caching, one
// sequence a step, tiny caches that preempt), give the naive engine's
// results: riders survive preemption of their host, chunking and
// prefix hits, and part from it at the right token.
func TestRidersMatchNaive(t *testing.T) {
	const vocab = 24
	set := sampler.NewIDSet(vocab, func(id int32) bool { return id%3 != 1 })
	for _, tc := range engineCases {
		t.Run(tc.name, func(t *testing.T) {
			reqs := genRequests(tc.seed+100, tc.k, vocab, 30, 40)
			for i, r := range reqs {
				stop := int32(-1)
				if len(r.Params.StopTokens) > 0 {
					stop = r.Params.StopTokens[0]
				}
				// Two candidates a draw: samples often draw alike, and
				// riders that part from their host together ride on.
				r.Params.N, r.Params.Temperature, r.Params.TopK = 1+i%6, 1, 2
				r.NewProcessor = func(int) sampler.LogitsProcessor { return runProc{set, vocab, stop, 22, 3} }
			}
			want := runConcurrent(t, NewNaive(newFake(tc.blocks, tc.bs, vocab)), reqs)
			e, err := New(newFake(tc.blocks, tc.bs, vocab), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := runConcurrent(t, e, reqs)
			for i := range reqs {
				if err := sameResult(got[i], want[i]); err != nil {
					t.Errorf("request %d (N %d): %v", i, reqs[i].Params.N, err)
				}
			}
			checkDrained(t, e)
		})
	}
}
