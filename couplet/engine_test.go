package couplet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

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
	}
}

func testPropertyEngine(t *testing.T, draws bool) {
	g := newFakeGen(t, realStackDraws(t, testModel, draws))
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
