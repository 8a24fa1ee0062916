package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"

	"chunlian/forward"
	"chunlian/sampler"
)

// countingProc is a stateful per-sample processor: it forbids the tokens
// ≡ its call count (mod 5) and checks that it is never called concurrently
// with itself and that generated grows by one token per call. Its state is
// its own, so the race detector flags any engine that runs one sequence's
// processor on two goroutines at once or without a happens-before edge.
type countingProc struct {
	busy  atomic.Bool
	calls int
	bad   *atomic.Int64 // shared by a test: violations seen
}

func (p *countingProc) Process(gen []int32, l []float32) error {
	if !p.busy.CompareAndSwap(false, true) {
		p.bad.Add(1)
	}
	defer p.busy.Store(false)
	if len(gen) != p.calls {
		p.bad.Add(1)
	}
	for i := p.calls % 5; i < len(l); i += 5 {
		l[i] = float32(math.Inf(-1))
	}
	p.calls++
	return nil
}

// equivRequests is genRequests plus processors: a stateful one per sample
// on a third of the requests, a dead end after three tokens on some.
func equivRequests(seed uint64, k, vocab int, bad *atomic.Int64) []*Request {
	reqs := genRequests(seed, k, vocab, 14, 12)
	for i, r := range reqs {
		switch i % 6 {
		case 1, 4:
			r.NewProcessor = func(int) sampler.LogitsProcessor { return &countingProc{bad: bad} }
		case 2:
			r.NewProcessor = func(int) sampler.LogitsProcessor {
				return sampler.LogitsProcessorFunc(func(g []int32, l []float32) error {
					if len(g) >= 3 {
						return sampler.ErrDeadEnd
					}
					return nil
				})
			}
		}
	}
	return reqs
}

// TestSamplingWorkersEquivalent: the same seeded requests (greedy and
// sampled, n > 1, processors, dead ends, prompt log-probs) give exactly
// the same tokens, log-probs and finish reasons whether the sampling phase
// runs on the engine goroutine alone or on several workers.
func TestSamplingWorkersEquivalent(t *testing.T) {
	const vocab = 300
	for _, seed := range []uint64{1, 2, 3} {
		var ref []*Result
		for _, workers := range []int{1, 4, 0, 2} {
			t.Run(fmt.Sprintf("seed=%d/workers=%d", seed, workers), func(t *testing.T) {
				var bad atomic.Int64
				e, err := New(newFake(512, 4, vocab), Config{SamplingWorkers: workers, MaxNumBatchedTokens: 64, EnablePrefixCaching: true})
				if err != nil {
					t.Fatal(err)
				}
				res := runConcurrent(t, e, equivRequests(seed, 48, vocab, &bad))
				checkDrained(t, e)
				if n := bad.Load(); n != 0 {
					t.Errorf("%d processor calls overlapped or saw the wrong history", n)
				}
				if ref == nil {
					ref = res
					return
				}
				for i := range res {
					if err := sameResult(ref[i], res[i]); err != nil {
						t.Errorf("request %d differs from workers=1: %v", i, err)
					}
				}
			})
		}
	}
}

// TestRowSamplerWorkers drives the parallel phase directly on a large
// step (more rows than workers × minRowsPerWorker, so several goroutines
// really run): rows with one task, with n tasks (a fork) and with none
// (prompt rows, whose log-sum-exp is filled), against one worker.
func TestRowSamplerWorkers(t *testing.T) {
	const V, rows = 777, 96
	rng := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, rows*V)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	// tasks builds fresh sequences (fresh Samplers: same seeds) for a run.
	tasks := func() []sampleTask {
		var ts []sampleTask
		for i := 0; i < rows; i++ {
			n := []int{1, 0, 3, 1}[i%4]
			p := sampler.Params{Seed: uint64(i + 1), MaxTokens: 5}
			if i%3 != 0 {
				p.Temperature, p.TopP = []float32{1, 0.7}[i%2], 0.9
			}
			r := &request{req: &Request{Prompt: []int32{1, 2, 3}, Params: p}}
			for k := range n {
				s := &sequence{r: r, index: k, tokens: []int32{1, 2, 3}, samp: sampler.New(p, k)}
				if i%5 == 0 {
					s.proc = sampler.LogitsProcessorFunc(func(_ []int32, l []float32) error {
						l[i%V] = float32(math.Inf(-1))
						return nil
					})
				}
				ts = append(ts, sampleTask{s: s, row: int32(i)})
			}
		}
		return ts
	}
	// One rowSampler for every run, as in the engine: a helper of one run
	// that starts late must not touch the next (go test -race checks).
	var rs rowSampler
	run := func(workers int) ([]sampleTask, []float64) {
		rs.tasks = tasks()
		lse := make([]float64, rows)
		for i := range lse {
			lse[i] = math.NaN()
		}
		rs.run(logits, V, rows, lse, workers)
		return rs.tasks, lse
	}
	wantT, wantL := run(1)
	for i, l := range wantL {
		if n := []int{1, 0, 3, 1}[i%4]; n == 1 {
			continue // left to the Sampler
		}
		if want := sampler.LogSumExp(logits[i*V : (i+1)*V]); l != want {
			t.Errorf("row %d: lse %v, want %v", i, l, want)
		}
	}
	for _, w := range []int{2, 3, 8, 8, 16, 2, 16} {
		gotT, gotL := run(w)
		if !slices.EqualFunc(gotL, wantL, func(a, b float64) bool { return a == b || (a != a && b != b) }) {
			t.Errorf("workers=%d: row log-sum-exps differ", w)
		}
		for k := range gotT {
			g, x := gotT[k], wantT[k]
			if g.tok != x.tok || g.lp != x.lp || !errors.Is(g.err, x.err) {
				t.Errorf("workers=%d task %d (row %d): %d %v %v, want %d %v %v", w, k, g.row, g.tok, g.lp, g.err, x.tok, x.lp, x.err)
			}
		}
	}
}

// TestRowSamplerSkipsIdleHelpers: run returns once every row is done,
// without waiting for helpers that never got a CPU (on one P the caller
// does every row before any helper starts; they then find no rows left).
func TestRowSamplerSkipsIdleHelpers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const V, rows, workers = 64, 16, 4
	logits := make([]float32, rows*V)
	var rs rowSampler
	p := sampler.Params{Seed: 1, MaxTokens: 5}
	r := &request{req: &Request{Prompt: []int32{1}, Params: p}}
	for i := range rows {
		rs.tasks = append(rs.tasks, sampleTask{s: &sequence{r: r, tokens: []int32{1}, samp: sampler.New(p, 0)}, row: int32(i)})
	}
	lse := make([]float64, rows)
	before := runtime.NumGoroutine()
	rs.run(logits, V, rows, lse, workers)
	// Read before anything here parks: the helpers are still queued.
	if got := runtime.NumGoroutine() - before; got != workers-1 {
		t.Errorf("%d helpers left queued when run returned, want %d (run waited for helpers that had no row)", got, workers-1)
	}
	for k, task := range rs.tasks {
		if task.err != nil || task.tok < 0 || int(task.tok) >= V {
			t.Fatalf("task %d: token %d, err %v", k, task.tok, task.err)
		}
	}
}

// lseBackend adds forward.RowLSEBackend to the fake: the float32 row
// log-sum-exp of each logits row (as a GPU would give) plus lseShift (so
// a test can tell it was used), nil when off, NaN for every row when nan.
type lseBackend struct {
	*fakeBackend
	off   bool
	nan   bool
	lse   []float32
	calls int // engine goroutine only (Forward and LogSumExp)
}

var _ forward.RowLSEBackend = (*lseBackend)(nil)

func (b *lseBackend) Forward(bt *forward.Batch, logits []float32) error {
	if err := b.fakeBackend.Forward(bt, logits); err != nil {
		return err
	}
	b.lse = b.lse[:0]
	for i := range bt.LogitRows {
		v := float32(sampler.LogSumExp(logits[i*b.vocab:(i+1)*b.vocab]) + lseShift)
		if b.nan {
			v = float32(math.NaN())
		}
		b.lse = append(b.lse, v)
	}
	return nil
}

func (b *lseBackend) LogSumExp() []float32 {
	b.calls++
	if b.off {
		return nil
	}
	return b.lse
}

// lseShift is added to lseBackend's log-sum-exps: every log-prob the
// engine reports from them is lseShift lower than the host's.
const lseShift = 0.25

// TestBackendRowLSE: an engine over a backend that supplies row
// log-sum-exps uses them (same tokens, log-probs lower by exactly the
// backend's shift, up to float32 rounding), and one that returns nil, or
// NaN rows, falls back to the host with bit-identical results.
func TestBackendRowLSE(t *testing.T) {
	const vocab = 200
	var bad atomic.Int64
	plain, err := New(newFake(512, 4, vocab), Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := runConcurrent(t, plain, equivRequests(9, 32, vocab, &bad))
	checkDrained(t, plain)
	for _, mode := range []string{"on", "nil", "nan"} {
		b := &lseBackend{fakeBackend: newFake(512, 4, vocab), off: mode == "nil", nan: mode == "nan"}
		e, err := New(b, Config{})
		if err != nil {
			t.Fatal(err)
		}
		got := runConcurrent(t, e, equivRequests(9, 32, vocab, &bad))
		checkDrained(t, e) // after Close: b.calls is ours to read
		if b.calls == 0 {
			t.Fatalf("%s: the engine never asked the backend for row log-sum-exps", mode)
		}
		for i := range got {
			if mode != "on" {
				if err := sameResult(want[i], got[i]); err != nil {
					t.Errorf("%s: request %d: %v", mode, i, err)
				}
				continue
			}
			if err := closeResult(shifted(want[i], -lseShift), got[i], 1e-5); err != nil {
				t.Errorf("request %d: %v", i, err)
			}
		}
	}
	if n := bad.Load(); n != 0 {
		t.Errorf("%d processor calls overlapped or saw the wrong history", n)
	}
}

// shifted returns a copy of r with every log-prob plus d.
func shifted(r *Result, d float32) *Result {
	c := *r
	c.PromptLogProbs = nil
	for _, v := range r.PromptLogProbs {
		c.PromptLogProbs = append(c.PromptLogProbs, v+d)
	}
	c.Completions = nil
	for _, comp := range r.Completions {
		comp.LogProbs = slices.Clone(comp.LogProbs)
		for j := range comp.LogProbs {
			comp.LogProbs[j] += d
		}
		c.Completions = append(c.Completions, comp)
	}
	return &c
}

// closeResult is sameResult with log-probs compared within tol.
func closeResult(a, b *Result, tol float64) error {
	near := func(x, y []float32) bool {
		return slices.EqualFunc(x, y, func(p, q float32) bool { return math.Abs(float64(p-q)) <= tol })
	}
	if len(a.Completions) != len(b.Completions) || !near(a.PromptLogProbs, b.PromptLogProbs) {
		return fmt.Errorf("completions %d vs %d, prompt logprobs %v vs %v", len(a.Completions), len(b.Completions), a.PromptLogProbs, b.PromptLogProbs)
	}
	for i := range a.Completions {
		ca, cb := a.Completions[i], b.Completions[i]
		if !slices.Equal(ca.Tokens, cb.Tokens) || ca.Finish != cb.Finish || !near(ca.LogProbs, cb.LogProbs) {
			return fmt.Errorf("sample %d: %v %v %s vs %v %v %s", i, ca.Tokens, ca.LogProbs, ca.Finish, cb.Tokens, cb.LogProbs, cb.Finish)
		}
	}
	return nil
}

// TestSharedProcessorConcurrent: one processor value shared by every
// sample of every request (like couplet's read-only constraints) is fine
// under the race detector as long as it is read-only.
func TestSharedProcessorConcurrent(t *testing.T) {
	const vocab = 64
	allowed := make([]bool, vocab) // read-only after this loop
	for i := range allowed {
		allowed[i] = i%3 != 1
	}
	shared := sampler.LogitsProcessorFunc(func(_ []int32, l []float32) error {
		for i, ok := range allowed {
			if !ok {
				l[i] = float32(math.Inf(-1))
			}
		}
		return nil
	})
	e, err := New(newFake(512, 4, vocab), Config{SamplingWorkers: 4})
	if err != nil {
		t.Fatal(err)
	}
	reqs := genRequests(4, 24, vocab, 10, 10)
	for _, r := range reqs {
		r.NewProcessor = func(int) sampler.LogitsProcessor { return shared }
	}
	for i, res := range runConcurrent(t, e, reqs) {
		for _, c := range res.Completions {
			for _, tok := range c.Tokens {
				if !allowed[tok] {
					t.Errorf("request %d sampled forbidden token %d", i, tok)
				}
			}
		}
	}
	checkDrained(t, e)
}

func TestSamplingWorkersValidate(t *testing.T) {
	if _, err := New(newFake(4, 4, 24), Config{SamplingWorkers: -1}); err == nil {
		t.Error("negative SamplingWorkers accepted")
	}
}
