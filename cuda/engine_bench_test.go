package cuda

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"chunlian/couplet"
	"chunlian/engine"
	"chunlian/model"
	"chunlian/sampler"
)

// The same task as scripts/hf_baseline.py's "lower" task, through the Go
// engine on this backend without HTTP or the couplet generator: prompt
// "<bos> <low> <len_8> <up> {8-character 上联} <sep>", exactly 8 greedy
// tokens (no stop token). Compare lines/s with the transformers baseline
// measured in the same device run.

// benchUppers are the 上联s hf_baseline.py uses (each doubled, cut to 8).
var benchUppers = []string{"春回大地千山秀", "福满人间万户春", "一帆风顺年年好", "万事如意步步高",
	"百世岁月当代好", "千古江山今朝新", "喜居宝地千年旺", "福照家门万事兴",
	"天增岁月人增寿", "春满乾坤福满门", "风调雨顺家家乐", "国泰民安处处春"}

func lowerPrompts(b *testing.B, m *model.Model, n int) [][]int32 {
	lenTok, ok := m.LengthToken(8)
	if !ok {
		b.Skip("model has no <len_8>")
	}
	var out [][]int32
	for i := 0; i < n; i++ {
		u := []rune(benchUppers[i%len(benchUppers)])
		u = append(u, u...)[:8]
		ids, err := m.Tok.Encode(string(u))
		if err != nil {
			// Characters outside the vocabulary: use the ids that encode.
			ids = nil
			for _, r := range u {
				if id, ok := m.Tok.ID(string(r)); ok {
					ids = append(ids, id)
				}
			}
		}
		p := []int32{m.Special("bos"), m.Special("lower"), lenTok, m.Special("up")}
		p = append(p, ids...)
		out = append(out, append(p, m.Special("sep")))
	}
	return out
}

// BenchmarkEngineLines: each iteration submits `users` lower-line requests
// at once and waits for all (one static batch's worth, served by
// continuous batching). Reports lines/s and per-line latency p50/p99.
func BenchmarkEngineLines(b *testing.B) {
	gpuOrSkip(b)
	m, err := trainedModel()
	if err != nil {
		b.Skipf("no trained model: %v", err)
	}
	// Two backends, alternating under -test.count: "default" is the serve
	// default, "nospin" the blocking hand-off to the CUDA thread
	// (Options.HandoffSpin < 0).
	variants := []struct {
		name string
		o    Options
	}{
		{"default", Options{KVCacheBytes: 8 << 30}},
		{"nospin", Options{KVCacheBytes: 8 << 30, HandoffSpin: -1}},
	}
	for _, v := range variants {
		g, err := New(m, v.o)
		if err != nil {
			b.Fatal(err)
		}
		paged, err := engine.New(g, engine.Config{MaxNumSeqs: 1024, MaxNumBatchedTokens: 8192, MaxQueue: 1 << 16, EnablePrefixCaching: true})
		if err != nil {
			b.Fatal(err)
		}
		naive := engine.NewNaive(g)
		benchEngineLines(b, m, v.name, naive, paged)
		naive.Close()
		paged.Close()
		g.Close()
	}
}

func benchEngineLines(b *testing.B, m *model.Model, variant string, naive, paged engine.Engine) {
	params := sampler.Params{Temperature: 0, TopP: 1, RepetitionPenalty: 1, MaxTokens: 8, N: 1}
	for _, tc := range []struct {
		name  string
		e     engine.Engine
		users int
	}{
		{"naive/users=1", naive, 1},
		{"paged/users=1", paged, 1},
		{"paged/users=128", paged, 128},
		{"paged/users=1024", paged, 1024},
	} {
		b.Run(variant+"/"+tc.name, func(b *testing.B) {
			prompts := lowerPrompts(b, m, tc.users)
			var mu sync.Mutex
			var lat []time.Duration
			tokens := 0
			run := func() {
				var wg sync.WaitGroup
				for i, p := range prompts {
					wg.Add(1)
					go func() {
						defer wg.Done()
						t0 := time.Now()
						res, err := tc.e.Generate(context.Background(), &engine.Request{ID: fmt.Sprint(i), Prompt: p, Params: params})
						d := time.Since(t0)
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						lat = append(lat, d)
						tokens += len(res.Completions[0].Tokens)
						mu.Unlock()
					}()
				}
				wg.Wait()
			}
			run() // warm-up: graph captures, buffer growth
			lat, tokens = lat[:0], 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				run()
			}
			b.StopTimer()
			slices.Sort(lat)
			pct := func(p float64) float64 {
				return float64(lat[min(len(lat)-1, int(p*float64(len(lat)-1)+0.5))].Microseconds()) / 1000
			}
			s := b.Elapsed().Seconds()
			b.ReportMetric(float64(len(lat))/s, "lines/s")
			b.ReportMetric(float64(tokens)/s, "tok/s")
			b.ReportMetric(pct(0.5), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
		})
	}
}

// BenchmarkCouplets runs the whole couplet pipeline (package couplet:
// constrained sampling with oversampling, 横批 retrieval and ranking by
// prompt log-probs) on the paged engine over this backend, without HTTP,
// with `users` requests in flight, at one sample per couplet and at the
// service's default. Run with -test.cpuprofile to see where the host time
// goes.
func BenchmarkCouplets(b *testing.B) {
	gpuOrSkip(b)
	m, err := trainedModel()
	if err != nil {
		b.Skipf("no trained model: %v", err)
	}
	// default = the serve default, nospin = blocking hand-off; see
	// BenchmarkEngineLines.
	for _, v := range []struct {
		name string
		o    Options
	}{
		{"default", Options{KVCacheBytes: 8 << 30}},
		{"nospin", Options{KVCacheBytes: 8 << 30, HandoffSpin: -1}},
	} {
		g, err := New(m, v.o)
		if err != nil {
			b.Fatal(err)
		}
		e, err := engine.New(g, engine.Config{MaxNumSeqs: 1024, MaxNumBatchedTokens: 8192, MaxQueue: 1 << 16, EnablePrefixCaching: true})
		if err != nil {
			b.Fatal(err)
		}
		// One sample per couplet, and the service's CUDA default (5
		// 上联s, the best 4 finished under load, every one while idle; 16
		// while idle for unseeded requests, and these are seeded).
		for _, k := range []int{1, 5} {
			gen, err := couplet.New(m, e, couplet.WithOversample(k), couplet.WithFinishers(4),
				couplet.WithIdleSamples(16, couplet.DefaultIdleBelow))
			if err != nil {
				b.Fatal(err)
			}
			benchCouplets(b, fmt.Sprintf("%s/samples=%d", v.name, k), gen, e)
		}
		e.Close()
		g.Close()
	}
}

// benchCouplets reports couplets/s and p50 latency at 1 and 100 users;
// at one user also where a couplet's time goes: engine steps per couplet
// and the mean wall time of each stage of couplet.Generate (Trace), the
// rest ("other-ms") being Generate's own work between the stages.
func benchCouplets(b *testing.B, variant string, gen *couplet.Generator, e engine.Engine) {
	words := []string{"平安", "富贵", "吉祥", "如意", "春风", "福星", "新年", "团圆"}
	for _, users := range []int{1, 100} {
		b.Run(fmt.Sprintf("%s/users=%d", variant, users), func(b *testing.B) {
			var wg sync.WaitGroup
			next := make(chan int)
			var mu sync.Mutex
			var lat []time.Duration
			stages := map[string]time.Duration{}
			steps0 := e.Stats().Steps
			for u := 0; u < users; u++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range next {
						var tr *couplet.Trace
						if users == 1 {
							tr = &couplet.Trace{}
						}
						t0 := time.Now()
						_, err := gen.Generate(context.Background(), couplet.Request{Mode: couplet.ModeKeyword, Text: words[i%len(words)], Seed: uint64(i + 1), Trace: tr})
						if err != nil {
							b.Error(err)
						}
						d := time.Since(t0)
						mu.Lock()
						lat = append(lat, d)
						if tr != nil {
							stages["other"] += d
							for _, st := range tr.Stages {
								stages[st.Name] += st.Wall
								stages["other"] -= st.Wall
							}
						}
						mu.Unlock()
					}
				}()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				next <- i
			}
			close(next)
			wg.Wait()
			b.StopTimer()
			slices.Sort(lat)
			n := float64(len(lat))
			b.ReportMetric(n/b.Elapsed().Seconds(), "couplets/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(e.Stats().Steps-steps0)/n, "steps/couplet")
			for name, d := range stages {
				b.ReportMetric(float64(d.Microseconds())/1000/n, name+"-ms")
			}
		})
	}
}
