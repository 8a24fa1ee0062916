package couplet

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"chunlian/critic"
	"chunlian/engine"
	"chunlian/forward"
	"chunlian/forward/forwardtest"
	"chunlian/model"
	"chunlian/sampler"
)

// realStack starts the paged engine on the random test model's CPU backend.
func realStack(t testing.TB, m *model.Model) engine.Engine { return realStackDraws(t, m, false) }

// realStackDraws is realStack, with the tokens drawn the GPU's way when
// draws is set: forwardtest.HostDraws plans every step's draws from the
// processors' masks (sampler.Masker) as on the CUDA backend.
func realStackDraws(t testing.TB, m *model.Model, draws bool) engine.Engine {
	t.Helper()
	cpu, err := forward.NewCPU(m, forward.CPUOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var b forward.Backend = cpu
	if draws {
		b = forwardtest.HostDraws(cpu)
	}
	e, err := engine.New(b, engine.Config{})
	if err != nil {
		b.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
		b.Close()
	})
	return e
}

// extraProc wraps an engine so that every sample also runs an extra
// processor after the couplet one (to build impossible constraints).
type extraProc struct {
	engine.Engine
	extra sampler.LogitsProcessor
}

func (x extraProc) Generate(ctx context.Context, r *engine.Request) (*engine.Result, error) {
	if r.NewProcessor != nil {
		inner := r.NewProcessor
		r.NewProcessor = func(i int) sampler.LogitsProcessor { return chain{inner(i), x.extra} }
	}
	return x.Engine.Generate(ctx, r)
}

// TestPropertyEngine is the point of the package: a random model (which on
// its own writes gibberish of any shape) plus the constraints, on the real
// engine, must still give well-formed couplets, for many seeds, keywords,
// modes and lengths — here also concurrently, as the service calls it —
// with tokens drawn on the host and, as on the GPU, from the processors'
// masks (device draws).
func TestPropertyEngine(t *testing.T) {
	for _, draws := range []bool{false, true} {
		t.Run(fmt.Sprintf("device draws %v", draws), func(t *testing.T) { testPropertyEngine(t, draws) })
		// Two of four samples continue past their 上联 (WithFinishers).
		t.Run(fmt.Sprintf("finishers, device draws %v", draws), func(t *testing.T) {
			testPropertyEngine(t, draws, WithOversample(4), WithFinishers(2))
		})
	}
}

func testPropertyEngine(t *testing.T, draws bool, opts ...Option) {
	g := newFakeGen(t, realStackDraws(t, testModel, draws), opts...)
	kws := usableKeywords(t, g)
	lengths := []int{0, 4, 5, 7, 9, 11, 13}
	uppers := []string{"春回大地", "天增岁月人增寿", "月照人照月", "春风入户，福气满门", "喜", "一年四季，春夏秋冬"}
	var reqs []Request
	for seed := uint64(1); seed <= 90; seed++ {
		var req Request
		switch seed % 3 {
		case 0:
			req = Request{Mode: ModeKeyword, Text: kws[int(seed/3)%len(kws)], Length: lengths[int(seed)%len(lengths)], N: 1 + int(seed)%3, Seed: seed}
		case 1:
			req = Request{Mode: ModeAcrostic, Text: kws[int(seed/3)%len(kws)], Length: lengths[int(seed/2)%len(lengths)], N: 2, Seed: seed}
		case 2:
			req = Request{Mode: ModeLower, Text: uppers[int(seed/3)%len(uppers)], N: 1, Seed: seed}
		}
		if g.Validate(req) == nil {
			reqs = append(reqs, req)
		}
	}
	if len(reqs) < 60 {
		t.Fatalf("only %d valid requests", len(reqs))
	}
	var wg sync.WaitGroup
	results := make([][]Couplet, len(reqs)) // [len(reqs)], slot i written by goroutine i only
	errs := make([]error, len(reqs))
	sem := make(chan struct{}, 8)
	for i, req := range reqs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i], errs[i] = g.Generate(context.Background(), req)
		}()
	}
	wg.Wait()
	for i, req := range reqs {
		if errs[i] != nil {
			t.Errorf("%+v: %v", req, errs[i])
			continue
		}
		if len(results[i]) == 0 || len(results[i]) > req.N {
			t.Errorf("%+v: %d couplets", req, len(results[i]))
		}
		checkResult(t, req, results[i])
	}
}

// TestReproducible: the same seed gives the same couplets.
func TestReproducible(t *testing.T) {
	g := newFakeGen(t, realStack(t, testModel))
	req := Request{Text: "吉祥", N: 2, Seed: 42}
	a, err := g.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) {
		t.Fatalf("%d vs %d couplets", len(a), len(b))
	}
	for i := range a {
		if a[i].Upper != b[i].Upper || a[i].Lower != b[i].Lower || a[i].Banner != b[i].Banner {
			t.Errorf("seed 42 gave %v then %v", a[i], b[i])
		}
	}
}

// recordEngine records the shape of every generating request.
type recordEngine struct {
	engine.Engine
	mu   sync.Mutex
	reqs []engine.Request // copies: N, MaxTokens and Prompt as sent
}

func (r *recordEngine) Generate(ctx context.Context, req *engine.Request) (*engine.Result, error) {
	if req.Params.MaxTokens > 0 {
		r.mu.Lock()
		r.reqs = append(r.reqs, engine.Request{Prompt: slices.Clone(req.Prompt), Params: req.Params})
		r.mu.Unlock()
	}
	return r.Engine.Generate(ctx, req)
}

// WithFinishers: the samples' 上联s come first in one request; only the
// kept ones continue, each from a prompt that ends in its 上联; seeded
// requests stay reproducible; streamed ones draw every sample whole.
func TestFinishers(t *testing.T) {
	rec := &recordEngine{Engine: realStack(t, testModel)}
	g := newFakeGen(t, rec, WithOversample(5), WithFinishers(2))
	for _, mode := range []Mode{ModeKeyword, ModeAcrostic} {
		req := Request{Mode: mode, Text: "吉祥", Length: 7, N: 1, Seed: 11}
		rec.reqs = nil
		a, err := g.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, req, a)
		first := rec.reqs[0]
		if first.Params.N != 5 || first.Params.MaxTokens != 7 {
			t.Fatalf("%s: first request N %d, MaxTokens %d; want the 5 上联s alone (7 tokens)", mode, first.Params.N, first.Params.MaxTokens)
		}
		cont := 0
		for _, r := range rec.reqs[1:] {
			if r.Params.N == 1 && r.Params.MaxTokens == 8 {
				cont++
				if len(r.Prompt) != len(first.Prompt)+7 || !slices.Equal(r.Prompt[:len(first.Prompt)], first.Prompt) {
					t.Errorf("%s: a continuation's prompt is not the 上联's prompt and a 上联", mode)
				}
			}
		}
		if cont != 2 {
			t.Errorf("%s: %d continuations, want 2", mode, cont)
		}
		b, err := g.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		// Scores may move in the last digits (the second run reads the
		// prefix cache): the text must not.
		if len(a) != len(b) || a[0].Upper != b[0].Upper || a[0].Lower != b[0].Lower || a[0].Banner != b[0].Banner {
			t.Errorf("%s: seed 11 gave %v, then %v", mode, a, b)
		}
	}
	rec.reqs = nil
	req := Request{Mode: ModeKeyword, Text: "吉祥", Length: 7, N: 1, Seed: 11, OnToken: func(TokenEvent) {}}
	if _, err := g.Generate(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if p := rec.reqs[0].Params; p.N != 5 || p.MaxTokens != 15 {
		t.Errorf("streamed: first request N %d, MaxTokens %d; want every sample whole", p.N, p.MaxTokens)
	}
	// With idle samples configured, a request while idle finishes every
	// sample (unseeded: the 8 idle samples; seeded: the 4), and one past
	// the bound finishes 2 of 4.
	g = newFakeGen(t, rec, WithOversample(4), WithFinishers(2), WithIdleSamples(8, 1))
	for _, tc := range []struct {
		seed   uint64
		busy   bool
		n, max int
	}{{0, false, 8, 15}, {3, false, 4, 15}, {3, true, 4, 7}} {
		rec.reqs = nil
		if tc.busy {
			g.inflight.Add(1)
		}
		if _, err := g.Generate(context.Background(), Request{Mode: ModeKeyword, Text: "吉祥", Length: 7, N: 1, Seed: tc.seed}); err != nil {
			t.Fatal(err)
		}
		if tc.busy {
			g.inflight.Add(-1)
		}
		if p := rec.reqs[0].Params; p.N != tc.n || p.MaxTokens != tc.max {
			t.Errorf("seed %d, busy %v: first request N %d, MaxTokens %d; want %d, %d", tc.seed, tc.busy, p.N, p.MaxTokens, tc.n, tc.max)
		}
	}
}

// TestImpossibleConstraintEngine: on the real engine, a processor that
// forbids every 平 character makes rule 2 unsatisfiable; Generate must
// return ErrNoCouplet quickly rather than hang or return a broken couplet.
func TestImpossibleConstraintEngine(t *testing.T) {
	probe := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()})
	noPing := sampler.LogitsProcessorFunc(func(_ []int32, l []float32) error {
		for i := range l {
			if i < len(probe.t.tone) && probe.t.tone[i] == TonePing {
				l[i] = negInf
			}
		}
		return nil
	})
	g := newFakeGen(t, extraProc{realStack(t, testModel), noPing}, WithMaxAttempts(2))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := g.Generate(ctx, Request{Text: "平安", N: 3, Seed: 8})
	if !errors.Is(err, ErrNoCouplet) {
		t.Fatalf("got %v, %v; want ErrNoCouplet", cs, err)
	}
}

// TestCancel: a cancelled context ends Generate with the context's error.
func TestCancel(t *testing.T) {
	g := newFakeGen(t, realStack(t, testModel))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Generate(ctx, Request{Text: "平安"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func benchGenerate(b *testing.B, m *model.Model, unconstrained bool, opts ...Option) {
	g, err := New(m, realStack(b, m), opts...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := g.Generate(ctx, Request{Text: "平安", Seed: uint64(i + 1), Unconstrained: unconstrained}); err != nil {
			b.Fatal(err)
		}
	}
}

// Latency of one couplet (N=1) on the random test model: unconstrained,
// constrained without banner retrieval, constrained with banner ranking.
func BenchmarkGenerateUnconstrained(b *testing.B) { benchGenerate(b, testModel, true) }
func BenchmarkGenerateConstrainedNoRetrieval(b *testing.B) {
	benchGenerate(b, testModel, false, WithBannerSources(), WithBannerTopK(0))
}
func BenchmarkGenerateConstrained(b *testing.B) {
	benchGenerate(b, testModel, false, WithBanners("五福临门", "万象更新", "吉星高照", "春回大地", "国泰民安", "福满人间"))
}

// The same on the shipped model (skipped when it is not embedded).
func defaultModel(b *testing.B) *model.Model {
	m, err := model.Default()
	if err != nil {
		b.Skipf("default model not available: %v", err)
	}
	return m
}

func BenchmarkDefaultUnconstrained(b *testing.B) { benchGenerate(b, defaultModel(b), true) }
func BenchmarkDefaultConstrainedNoRetrieval(b *testing.B) {
	benchGenerate(b, defaultModel(b), false, WithBannerSources(), WithBannerTopK(0))
}
func BenchmarkDefaultConstrained(b *testing.B) { benchGenerate(b, defaultModel(b), false) }
func BenchmarkDefaultConstrainedOneSample(b *testing.B) {
	benchGenerate(b, defaultModel(b), false, WithBannerSources(), WithBannerTopK(0), WithOversample(1))
}

// The speed/quality knobs the service exposes (--samples-per-couplet,
// --banner-candidates), on the shipped model.
func BenchmarkDefaultOneSampleBanners8(b *testing.B) {
	benchGenerate(b, defaultModel(b), false, WithOversample(1))
}
func BenchmarkDefaultOneSampleBanners4(b *testing.B) {
	benchGenerate(b, defaultModel(b), false, WithOversample(1), WithBannerTopK(4))
}

// Ten users at once on the shipped model, with the service's defaults (one
// sample per couplet, 横批 ranking): the engine batches their steps.
func BenchmarkDefaultConcurrent10(b *testing.B) {
	m := defaultModel(b)
	g, err := New(m, realStack(b, m), WithOversample(1))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	done := 0
	for i := 0; i < b.N; i++ {
		done += tenUsers(b, g, i)
	}
	b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "couplets/s")
}

// nullDevice is a forward.AsyncDrawBackend that does no model work, so a
// benchmark on it measures the host side of GPU serving: the engine loop
// (scheduling, draw planning, landing results), the couplet rules and the
// request goroutines. Its logits are one fixed row; a draw takes the
// forced token, or the first allowed token at or after a position set by
// the draw's uniform number (so samples differ and respect the rules'
// masks, as the device's draws do). Launches complete at once.
type nullDevice struct {
	numBlocks, bs int
	row           []float32 // [V] every row's logits
	lse           float32   // log-sum-exp of row
	masks         [][]uint64
	lastLSE       []float32 // [rows of the last Forward or ForwardDraw]
	// latency is each launch's time "on the device": WaitDraw returns no
	// earlier, so steps grow as on a GPU, whose forward takes ~0.3 ms.
	latency time.Duration
	slots   [2]struct {
		ready     time.Time
		out       []forward.Drawn
		hostRows  int
		logitRows int
	}
}

var _ forward.AsyncDrawBackend = (*nullDevice)(nil)

func newNullDevice(vocab, numBlocks, bs int) *nullDevice {
	n := &nullDevice{numBlocks: numBlocks, bs: bs, row: make([]float32, vocab)}
	for i := range n.row {
		n.row[i] = float32(i%97) / 16 // no token dominates, so draws spread
	}
	n.lse = float32(sampler.LogSumExp(n.row))
	return n
}

func (n *nullDevice) NumBlocks() int                           { return n.numBlocks }
func (n *nullDevice) BlockSize() int                           { return n.bs }
func (n *nullDevice) VocabSize() int                           { return len(n.row) }
func (n *nullDevice) Close() error                             { return nil }
func (n *nullDevice) CopyBlocks(src, dst, slots []int32) error { return nil }
func (n *nullDevice) DrawVocab() bool                          { return true }
func (n *nullDevice) RegisterMask(allowed []uint64) (int32, error) {
	n.masks = append(n.masks, slices.Clone(allowed))
	return int32(len(n.masks) - 1), nil
}

func (n *nullDevice) LogSumExp() []float32 { return n.lastLSE }

func (n *nullDevice) setLSE(rows int) {
	n.lastLSE = n.lastLSE[:0]
	for range rows {
		n.lastLSE = append(n.lastLSE, n.lse)
	}
}

func (n *nullDevice) Forward(b *forward.Batch, logits []float32) error {
	n.setLSE(len(b.LogitRows))
	for i := range b.LogitRows {
		copy(logits[i*len(n.row):], n.row)
	}
	return nil
}

func (n *nullDevice) draw(d forward.Draw) forward.Drawn {
	if d.Force >= 0 {
		return forward.Drawn{Tok: d.Force, Logit: n.row[d.Force]}
	}
	V := len(n.row)
	start := int(d.U * float64(V))
	for k := range V {
		t := int32((start + k) % V)
		if d.Mask >= 0 {
			m := n.masks[d.Mask]
			if int(t/64) >= len(m) || m[t/64]&(1<<(t%64)) == 0 {
				continue
			}
		}
		if !slices.Contains(d.Exclude, t) {
			return forward.Drawn{Tok: t, Logit: n.row[t]}
		}
	}
	return forward.Drawn{Tok: -1}
}

func (n *nullDevice) ForwardDraw(b *forward.Batch, draws []forward.Draw, out []forward.Drawn, hostRows []int32, logits []float32) error {
	n.setLSE(len(b.LogitRows))
	for i, d := range draws {
		out[i] = n.draw(d)
	}
	for k := range hostRows {
		copy(logits[k*len(n.row):], n.row)
	}
	return nil
}

func (n *nullDevice) LaunchDraw(slot int, b *forward.Batch, draws []forward.Draw, hostRows []int32) error {
	s := &n.slots[slot]
	s.out = s.out[:0]
	for _, d := range draws {
		s.out = append(s.out, n.draw(d))
	}
	s.hostRows, s.logitRows = len(hostRows), len(b.LogitRows)
	s.ready = time.Now().Add(n.latency)
	return nil
}

func (n *nullDevice) WaitDraw(slot int, out []forward.Drawn, logits []float32, lse []float32) error {
	s := &n.slots[slot]
	if len(out) != len(s.out) || len(logits) != s.hostRows*len(n.row) || len(lse) != s.logitRows {
		return fmt.Errorf("nullDevice: WaitDraw slices %d/%d/%d, launch had %d/%d/%d", len(out), len(logits), len(lse), len(s.out), s.hostRows*len(n.row), s.logitRows)
	}
	time.Sleep(time.Until(s.ready))
	copy(out, s.out)
	for k := range s.hostRows {
		copy(logits[k*len(n.row):], n.row)
	}
	for i := range lse {
		lse[i] = n.lse
	}
	return nil
}

// BenchmarkHostLoop: the GPU's host side without a GPU. `users` closed-loop
// clients generate couplets (the CUDA default of 5 上联s with the best 4
// finished, or 1 sample; 横批 scoring) on the
// shipped model's vocabulary and rules through two engine loops with the
// CUDA step limits and the engine's queue bound, each on a nullDevice taking
// 0.25 ms a step, at the CUDA default of 2-token KV blocks, at 4 or at 1, through
// the prefix cache as the CUDA service does or with kept samples
// (--experimental cuda-keep). Reports couplets/s, the engine
// loops' host time (schedule + consume) per step and per logits row (the
// figures the GPU's bench reports as "host ms per step"), the mean
// share of allocated KV slots live, the mean empty and live slots, and
// the objects allocated per couplet.
func BenchmarkHostLoop(b *testing.B) {
	m := defaultModel(b)
	// The CUDA default (5 上联s, the best 4 finished) and one sample.
	// Blocks of 2 tokens are the CUDA default, 1 what fills every slot.
	for _, c := range []struct {
		users, samples, finish, bs int
		keep                       bool
	}{{100, 5, 4, 2, false}, {1000, 5, 4, 2, false}, {1000, 5, 4, 2, true}, {1000, 5, 4, 1, true}, {1000, 5, 4, 4, false}, {1000, 5, 4, 1, false}, {1000, 1, 0, 2, false}, {2000, 1, 0, 2, false}} {
		users := c.users
		b.Run(fmt.Sprintf("users=%d/samples=%d/finish=%d/block=%d/keep=%v", users, c.samples, c.finish, c.bs, c.keep), func(b *testing.B) {
			var es []engine.Engine
			for range 2 {
				// The CUDA service's cache: 262,144 tokens' worth per
				// engine at any block size (cmd/chunlian's cudaCacheTokens),
				// so that the block metadata and the hash index are as
				// large as there and miss the CPU's caches as often.
				dev := newNullDevice(m.Config.VocabSize, (1<<18)/c.bs, c.bs)
				dev.latency = 250 * time.Microsecond
				e, err := engine.New(dev, engine.Config{
					MaxNumSeqs: 4096, MaxNumBatchedTokens: 16384, EnablePrefixCaching: true,
				})
				if err != nil {
					b.Fatal(err)
				}
				es = append(es, e)
			}
			eng := engine.NewShards(es...)
			defer eng.Close()
			// The served generator's judge (ranking features, the year check).
			g, err := New(m, eng, WithOversample(c.samples), WithFinishers(c.finish), WithKeptSamples(c.keep), WithJudge(critic.Judge{Year: 2027}))
			if err != nil {
				b.Fatal(err)
			}
			const perUser = 4
			var fails atomic.Int64
			round := func(r int) {
				var wg sync.WaitGroup
				for u := range users {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for k := range perUser {
							seed := uint64((r*users+u)*perUser + k + 1)
							if _, err := g.Generate(context.Background(), Request{Text: tenWords[int(seed)%len(tenWords)], Seed: seed}); err != nil {
								fails.Add(1)
							}
						}
					}()
				}
				wg.Wait()
			}
			round(0) // warm-up: masks registered, buffers grown
			st0 := eng.Stats()
			// The mean share of allocated KV slots holding a live token,
			// sampled as the service's metric is.
			stop := pollKVLive(eng, 20*time.Millisecond)
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			r := 1
			for b.Loop() {
				round(r)
				r++
			}
			runtime.ReadMemStats(&ms1)
			live, alloc, polls := stop()
			st := eng.Stats()
			steps := float64(st.Steps - st0.Steps)
			host := (st.StepSeconds.Schedule - st0.StepSeconds.Schedule) + (st.StepSeconds.Consume - st0.StepSeconds.Consume)
			b.ReportMetric(float64(users*perUser*(r-1))/b.Elapsed().Seconds(), "couplets/s")
			b.ReportMetric(1e3*host/steps, "host-ms/step")
			b.ReportMetric(1e9*host/float64(st.LogitRows-st0.LogitRows), "host-ns/row")
			b.ReportMetric(float64(st.ComputedTokens-st0.ComputedTokens)/float64(users*perUser*(r-1)), "rows/couplet")
			b.ReportMetric(float64(st.LogitRows-st0.LogitRows)/float64(users*perUser*(r-1)), "logit-rows/couplet")
			b.ReportMetric(float64(st.ComputedTokens-st0.ComputedTokens)/steps, "rows/step")
			// Every goroutine's allocations (requests, rules, engine loops):
			// with the GC off on CUDA they set how often the memory limit
			// starts a collection.
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(users*perUser*(r-1)), "allocs/couplet")
			if alloc > 0 {
				b.ReportMetric(100*live/alloc, "%live")
				// The share alone rises when the cache holds more full
				// blocks; the empty slots are the waste itself.
				b.ReportMetric((alloc-live)/float64(polls), "empty-slots")
				b.ReportMetric(live/float64(polls), "live-slots")
			}
			if f := fails.Load(); f > 0 {
				b.Logf("%d requests failed", f)
			}
		})
	}
}
