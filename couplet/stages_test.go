package couplet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"chunlian/engine"
	"chunlian/forward"
	"chunlian/model"
)

// cpuTime is the process's user + system CPU time so far. On a shared
// machine CPU time per couplet moves far less with other people's load
// than wall time does (it still includes cache and SMT interference).
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchStages runs single keyword couplets (one at a time, so the engine
// counters are this call's own) with a Trace and reports, per couplet, the
// wall time, engine steps and computed token rows of every stage plus the
// totals. It is the per-stage breakdown of the single-couplet latency
// budget.
func benchStages(b *testing.B, opts ...Option) { benchStagesOn(b, nil, opts...) }

// benchStagesOn is benchStages on the engine wrapped by wrap (nil: as is).
func benchStagesOn(b *testing.B, wrap func(engine.Engine) engine.Engine, opts ...Option) {
	m := defaultModel(b)
	var e engine.Engine = realStack(b, m)
	if wrap != nil {
		e = wrap(e)
	}
	g, err := New(m, e, opts...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	words := []string{"平安", "富贵", "吉祥", "如意", "福寿", "康宁", "兴旺", "团圆", "和顺", "安康"}
	names := []string{StageCandidates, StageRank, StageBannerRetrieval, StageBannerScoring}
	sum := map[string]*StageTrace{}
	for _, n := range names {
		sum[n] = &StageTrace{Name: n}
	}
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for i := 0; i < b.N; i++ {
		var tr Trace
		if _, err := g.Generate(ctx, Request{Text: words[i%len(words)], Seed: uint64(i + 1), Trace: &tr}); err != nil {
			b.Fatal(err)
		}
		for _, st := range tr.Stages {
			a, ok := sum[st.Name]
			if !ok {
				b.Fatalf("unknown stage %q", st.Name)
			}
			a.Wall += st.Wall
			a.EngineSteps += st.EngineSteps
			a.ComputedTokens += st.ComputedTokens
			a.EngineRequests += st.EngineRequests
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/1000/n, "cpu-ms/couplet")
	var steps, rows float64
	for _, name := range names {
		a := sum[name]
		b.ReportMetric(float64(a.Wall.Microseconds())/1000/n, name+"-ms")
		if a.EngineRequests > 0 {
			b.ReportMetric(float64(a.EngineSteps)/n, name+"-steps")
			b.ReportMetric(float64(a.ComputedTokens)/n, name+"-rows")
		}
		steps += float64(a.EngineSteps) / n
		rows += float64(a.ComputedTokens) / n
	}
	b.ReportMetric(steps, "steps/couplet")
	b.ReportMetric(rows, "rows/couplet")
}

// testBannerSources are the service's retrieval lists.
func testBannerSources() []BannerSource { return DefaultBannerSources() }

// The service defaults (--samples-per-couplet 1, 横批 ranking).
func BenchmarkDefaultStages(b *testing.B) {
	benchStages(b, WithOversample(1), WithBannerSources(testBannerSources()...))
}

// No retrieval: the model's own 横批 only.
func BenchmarkDefaultStagesNoRetrieval(b *testing.B) {
	benchStages(b, WithOversample(1), WithBannerSources(), WithBannerTopK(0))
}

// Ten users at once with the service defaults, reporting CPU time and
// engine steps per couplet besides throughput.
func BenchmarkDefaultStagesConcurrent10(b *testing.B) { benchConcurrent10(b, nil) }

// benchConcurrent10 is BenchmarkDefaultStagesConcurrent10 on the engine
// wrapped by wrap (nil: as is).
func benchConcurrent10(b *testing.B, wrap func(engine.Engine) engine.Engine) {
	m := defaultModel(b)
	var e engine.Engine = realStack(b, m)
	if wrap != nil {
		e = wrap(e)
	}
	g, err := New(m, e, WithOversample(1), WithBannerSources(testBannerSources()...))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu0, st0 := cpuTime(b), g.e.Stats()
	for i := 0; i < b.N; i++ {
		tenUsers(b, g, i)
	}
	n := float64(b.N * len(tenWords))
	st := g.e.Stats()
	b.ReportMetric(n/b.Elapsed().Seconds(), "couplets/s")
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/1000/n, "cpu-ms/couplet")
	b.ReportMetric(float64(st.Steps-st0.Steps)/float64(b.N), "steps/round")
	b.ReportMetric(float64(st.ComputedTokens-st0.ComputedTokens)/n, "rows/couplet")
}

// BenchmarkKVEfficiencyCouplets: the service's own workload (ten users,
// keyword couplets with the service defaults, shipped model) at KV
// block sizes 1, 2, 4 and 16: the share of allocated KV slots holding live tokens,
// averaged over Stats snapshots taken every 200 µs while couplets run
// (engine.Stats is refreshed after every step), and the throughput, so
// that the memory figure and its cost come from the same run.
func BenchmarkKVEfficiencyCouplets(b *testing.B) {
	m := defaultModel(b)
	for _, bs := range []int{1, 2, 4, 16} {
		b.Run(fmt.Sprintf("block=%d", bs), func(b *testing.B) {
			be, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: bs})
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			e, err := engine.New(be, engine.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			g, err := New(m, e, WithOversample(1), WithBannerSources(testBannerSources()...))
			if err != nil {
				b.Fatal(err)
			}
			stop := pollKVLive(e, 200*time.Microsecond)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tenUsers(b, g, i)
			}
			b.StopTimer()
			live, alloc, _ := stop()
			if alloc == 0 {
				b.Fatal("no KV usage observed")
			}
			b.ReportMetric(float64(b.N*len(tenWords))/b.Elapsed().Seconds(), "couplets/s")
			b.ReportMetric(100*live/alloc, "live%")
		})
	}
}

// pollKVLive samples e's live and allocated KV slots every period until
// the returned stop is called, which gives their sums over the samples
// (the service's metric is their ratio).
func pollKVLive(e engine.Engine, period time.Duration) (stop func() (live, alloc float64, polls int)) {
	done := make(chan struct{})
	var live, alloc float64
	var polls int
	var polled sync.WaitGroup
	polled.Add(1)
	go func() {
		defer polled.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if st := e.Stats(); st.KVSlotsAllocated > 0 {
					live += float64(st.KVSlotsLive)
					alloc += float64(st.KVSlotsAllocated)
					polls++
				}
			}
		}
	}()
	return func() (float64, float64, int) {
		close(done)
		polled.Wait()
		return live, alloc, polls
	}
}

// tenWords are the keywords of the ten-user benchmarks, one per user.
var tenWords = []string{"平安", "富贵", "吉祥", "如意", "福寿", "康宁", "兴旺", "团圆", "和顺", "安康"}

// tenUsers runs round i of the ten-user benchmarks: one keyword couplet
// per word of tenWords, all at once (seeds distinct across rounds), and
// returns how many succeeded.
func tenUsers(b *testing.B, g *Generator, i int) int {
	var wg sync.WaitGroup
	var ok atomic.Int64
	for u, w := range tenWords {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := g.Generate(context.Background(), Request{Text: w, Seed: uint64(i*len(tenWords) + u + 1)}); err != nil {
				b.Error(err)
				return
			}
			ok.Add(1)
		}()
	}
	wg.Wait()
	return int(ok.Load())
}

// TestKeptSamplesReleased: the generator keeps its 上联 requests' samples
// (engine.Request.Keep), continues the best through their handles, and
// gives every other one back, so that once a couplet is served the engine
// holds no block, on the finisher path (5 上联s, the best 3 finished) and
// on the idle path (every sample written whole, the chosen one continued
// by the 横批 request); and the continued requests read the kept samples
// instead of the prefix cache.
func TestKeptSamplesReleased(t *testing.T) {
	m, err := model.Default()
	if err != nil {
		t.Skipf("default model not available: %v", err)
	}
	for _, tc := range []struct {
		name string
		opts []Option
		seed uint64
	}{
		{"finishers", []Option{WithOversample(5), WithFinishers(3)}, 7},
		{"idle", []Option{WithOversample(2), WithIdleSamples(6, DefaultIdleBelow), WithFinishers(3)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := realStack(t, m)
			g, err := New(m, e, append(tc.opts, WithBannerSources(testBannerSources()...))...)
			if err != nil {
				t.Fatal(err)
			}
			// The idle path samples unseeded, and a couplet whose 横批 pool
			// holds one candidate takes it without a request (平安 about a
			// third of the time): go on until four requests were seen.
			var reqs, prompt, cached int
			for round := 0; round < 8 && reqs < 4; round++ {
				for _, w := range []string{"平安", "春风", "如意", "新年"} {
					var tr Trace
					if _, err := g.Generate(context.Background(), Request{Text: w, Seed: tc.seed, Trace: &tr}); err != nil {
						t.Fatal(err)
					}
					st := tr.Stage(StageBannerScoring)
					reqs, prompt, cached = reqs+st.EngineRequests, prompt+st.PromptTokens, cached+st.CachedTokens
				}
			}
			deadline := time.Now().Add(2 * time.Second)
			for st := e.Stats(); st.KVBlocksUsed != 0 || st.Running != 0; st = e.Stats() {
				if time.Now().After(deadline) {
					t.Fatalf("blocks still held after the couplet: %+v", st)
				}
				time.Sleep(time.Millisecond)
			}
			// The 横批 request continues the couplet's kept sample: of its
			// prompt only the 下联's last character (drawn, never fed) and
			// <ban> are computed. Through the prefix cache it would find
			// nothing past the keyword's prompt, since kept requests do not
			// register what they generate.
			if reqs == 0 || prompt-cached != 2*reqs {
				t.Errorf("横批 stage: %d requests, %d prompt tokens, %d cached; want 2 uncached each", reqs, prompt, cached)
			}
		})
	}
}

// keepCounter passes requests and releases to a Keeper engine, counting
// the requests that ask to keep their samples or continue one.
type keepCounter struct {
	engine.Engine
	keep, from atomic.Int64
}

func (k *keepCounter) Generate(ctx context.Context, req *engine.Request) (*engine.Result, error) {
	if req.Keep {
		k.keep.Add(1)
	}
	if req.From != 0 {
		k.from.Add(1)
	}
	return k.Engine.Generate(ctx, req)
}

func (k *keepCounter) Release(hs ...engine.Handle) { k.Engine.(engine.Keeper).Release(hs...) }

// TestWithKeptSamples: by default the generator keeps samples and
// continues them; WithKeptSamples(false) never asks, on the same engine.
func TestWithKeptSamples(t *testing.T) {
	m, err := model.Default()
	if err != nil {
		t.Skipf("default model not available: %v", err)
	}
	for _, on := range []bool{true, false} {
		e := &keepCounter{Engine: realStack(t, m)}
		g, err := New(m, e, WithOversample(5), WithFinishers(3), WithKeptSamples(on), WithBannerSources(testBannerSources()...))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.Generate(context.Background(), Request{Text: "平安", Seed: 7}); err != nil {
			t.Fatal(err)
		}
		if k, f := e.keep.Load(), e.from.Load(); (k > 0 && f > 0) != on || (!on && k+f != 0) {
			t.Errorf("kept samples %v: %d requests kept, %d continued one", on, k, f)
		}
	}
}

// firstOnly lets one request that is not a follow-up through and refuses
// every later one as a full queue would.
type firstOnly struct {
	keepCounter
	firsts, follows atomic.Int64
}

func (f *firstOnly) Generate(ctx context.Context, req *engine.Request) (*engine.Result, error) {
	if req.FollowUp {
		f.follows.Add(1)
	} else if f.firsts.Add(1) > 1 {
		return nil, engine.ErrQueueFull
	}
	return f.keepCounter.Generate(ctx, req)
}

// TestFollowUpsMarked: every engine request of a couplet after its first
// (the finishers, the 横批, later rounds) is a follow-up, which a full
// queue does not refuse, so the couplet is not lost half made; a second
// couplet is refused.
func TestFollowUpsMarked(t *testing.T) {
	m, err := model.Default()
	if err != nil {
		t.Skipf("default model not available: %v", err)
	}
	for _, on := range []bool{true, false} {
		e := &firstOnly{keepCounter: keepCounter{Engine: realStack(t, m)}}
		g, err := New(m, e, WithOversample(5), WithFinishers(3), WithKeptSamples(on), WithBannerSources(testBannerSources()...))
		if err != nil {
			t.Fatal(err)
		}
		cs, err := g.Generate(context.Background(), Request{Text: "平安", Seed: 7})
		if err != nil {
			t.Fatalf("kept samples %v: %v", on, err)
		}
		if len(cs) != 1 || !Check(cs[0].Upper, cs[0].Lower, cs[0].Banner).OK() {
			t.Errorf("kept samples %v: %+v", on, cs)
		}
		if n := e.follows.Load(); n < 4 { // 3 finishers and the 横批
			t.Errorf("kept samples %v: %d follow-ups, want at least 4", on, n)
		}
		if _, err := g.Generate(context.Background(), Request{Text: "平安", Seed: 8}); !errors.Is(err, engine.ErrQueueFull) {
			t.Errorf("kept samples %v: second couplet: %v, want ErrQueueFull", on, err)
		}
	}
}

// TestStageRowsExact: a traced couplet's stages count the token rows the
// engine ran for it, no more and no fewer (run alone, the engine's
// counter moves by their sum), also when samples ride one sequence and
// 下联s continue the best 上联s.
func TestStageRowsExact(t *testing.T) {
	e := realStack(t, testModel)
	g := newFakeGen(t, e, WithOversample(5), WithFinishers(3))
	for i, w := range []string{"吉祥", "平安", "春风"} {
		var tr Trace
		st0 := e.Stats()
		if _, err := g.Generate(context.Background(), Request{Text: w, Length: 7, Seed: uint64(i + 1), Trace: &tr}); err != nil {
			t.Fatal(err)
		}
		rows := 0
		for _, s := range tr.Stages {
			rows += s.ComputedTokens
		}
		if d := e.Stats().ComputedTokens - st0.ComputedTokens; int64(rows) != d || rows == 0 {
			t.Errorf("%s: the stages count %d rows, the engine ran %d", w, rows, d)
		}
	}
}
