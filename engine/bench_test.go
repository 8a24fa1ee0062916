package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"chunlian/forward"
	"chunlian/model"
	"chunlian/sampler"
)

// baseShape is a random model with the shipped model's shape (as in
// forward's benchmarks), so figures mean something before the trained
// weights exist.
func baseShape() model.Config {
	c := model.TestConfig()
	c.VocabSize, c.HiddenSize, c.IntermediateSize = 6000, 384, 1024
	c.NumLayers, c.NumHeads, c.NumKVHeads, c.HeadDim = 8, 6, 6, 64
	c.TieWordEmbeddings = true
	return c
}

// benchSamplingWorkers reads CHUNLIAN_BENCH_SAMPLING_WORKERS (unset = 0,
// the default), so one test binary can compare sampling on the engine
// goroutine alone (1) with the parallel phase in back-to-back runs.
func benchSamplingWorkers(b *testing.B) int {
	v := os.Getenv("CHUNLIAN_BENCH_SAMPLING_WORKERS")
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("CHUNLIAN_BENCH_SAMPLING_WORKERS=%q", v)
	}
	return n
}

type benchModel struct {
	name string
	m    func() (*model.Model, error)
}

func benchModels() []benchModel {
	return []benchModel{
		{"random-test", func() (*model.Model, error) { return model.NewRandom(model.TestConfig(), 1), nil }},
		{"random-base-shape", func() (*model.Model, error) { return model.NewRandom(baseShape(), 1), nil }},
		{"default", model.Default},
	}
}

// benchRequests makes k greedy requests of promptLen random tokens that
// each generate exactly genLen tokens (no stop tokens).
func benchRequests(k, vocab, promptLen, genLen int) []*Request {
	var reqs []*Request
	for i, p := range randomPrompts(uint64(k), k, vocab, 1) {
		prompt := make([]int32, promptLen)
		for j := range prompt {
			prompt[j] = (p[0] + int32(i*7+j*13)) % int32(vocab)
		}
		reqs = append(reqs, &Request{Prompt: prompt, Params: sampler.Params{MaxTokens: genLen}})
	}
	return reqs
}

func runAll(b *testing.B, e Engine, reqs []*Request) {
	var wg sync.WaitGroup
	errs := make(chan error, len(reqs))
	for _, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.Generate(context.Background(), r); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// BenchmarkDecode: `batch` concurrent requests (8 prompt tokens, 32
// generated) through the paged engine; reports generated tokens/s, which is
// decode-dominated (the 8-token prefills are one step).
func BenchmarkDecode(b *testing.B) {
	const promptLen, genLen = 8, 32
	for _, bm := range benchModels() {
		m, err := bm.m()
		if err != nil {
			b.Logf("%s: %v (skipped)", bm.name, err)
			continue
		}
		for _, batch := range []int{1, 8, 32, 128} {
			b.Run(fmt.Sprintf("%s/batch=%d", bm.name, batch), func(b *testing.B) {
				be, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: 16, KVCacheBytes: int64(batch*(promptLen+genLen+16)) * forward.KVBytesPerToken(m.Config)})
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				cfg := DefaultConfig()
				cfg.SamplingWorkers = benchSamplingWorkers(b)
				e, err := New(be, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close()
				reqs := benchRequests(batch, m.Config.VocabSize, promptLen, genLen)
				runAll(b, e, reqs[:min(8, len(reqs))]) // warm-up (kernel threads, buffers); b.Loop resets the timer
				c0 := cpuTime()
				for b.Loop() {
					runAll(b, e, reqs)
				}
				b.ReportMetric(float64(batch*genLen*b.N)/b.Elapsed().Seconds(), "tok/s")
				b.ReportMetric(float64((cpuTime()-c0).Nanoseconds())/float64(batch*genLen*b.N), "cpu-ns/token")
			})
		}
	}
}

// BenchmarkRequests compares the paged engine with the naive baseline in the
// same run: `users` concurrent couplet-sized requests (12 prompt tokens, 24
// generated); reports requests/s.
func BenchmarkRequests(b *testing.B) {
	const users, promptLen, genLen = 16, 12, 24
	for _, bm := range benchModels() {
		m, err := bm.m()
		if err != nil {
			b.Logf("%s: %v (skipped)", bm.name, err)
			continue
		}
		for _, kind := range []string{"engine", "naive"} {
			b.Run(bm.name+"/"+kind, func(b *testing.B) {
				be, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: 16})
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				var e Engine = NewNaive(be)
				if kind == "engine" {
					if e, err = New(be, Config{}); err != nil {
						b.Fatal(err)
					}
				}
				defer e.Close()
				reqs := benchRequests(users, m.Config.VocabSize, promptLen, genLen)
				runAll(b, e, reqs[:min(8, len(reqs))]) // warm-up (kernel threads, buffers); b.Loop resets the timer
				for b.Loop() {
					runAll(b, e, reqs)
				}
				b.ReportMetric(float64(users*b.N)/b.Elapsed().Seconds(), "req/s")
			})
		}
	}
}

// BenchmarkKVEfficiency measures the share of allocated KV slots that hold
// live tokens while 32 couplet-sized requests (12 prompt tokens, up to 24
// generated, n = 2) run together, sampled once per engine step, for several
// block sizes; "contiguous%" is the same live tokens over a per-sequence
// max-length (prompt + MaxTokens) reservation, the pre-PagedAttention way.
func BenchmarkKVEfficiency(b *testing.B) {
	const users, promptLen, genLen = 32, 12, 24
	m := model.NewRandom(model.TestConfig(), 1)
	for _, bs := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("block=%d", bs), func(b *testing.B) {
			be, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: bs})
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			e, err := New(be, Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			var live, alloc, contig float64
			lastStep := int64(-1)
			reqs := benchRequests(users, m.Config.VocabSize, promptLen, genLen)
			for _, r := range reqs {
				r.Params.N = 2
				r.OnEvent = func(Event) { // engine goroutine: may read e's state
					if e.steps == lastStep {
						return
					}
					lastStep = e.steps
					u := e.mgr.Usage()
					live += float64(u.LiveSlots)
					alloc += float64(u.AllocatedSlots)
					contig += float64(e.mgr.NumSeqs() * (promptLen + genLen))
				}
			}
			for b.Loop() {
				runAll(b, e, reqs)
			}
			b.ReportMetric(100*live/alloc, "paged%")
			b.ReportMetric(100*live/contig, "contiguous%")
		})
	}
}

// nullBackend does no model work: its logits are a fixed row, so
// BenchmarkEngineOverhead measures the scheduler, block manager, batch
// building and sampling alone.
type nullBackend struct {
	numBlocks, bs int
	row           []float32
}

func (n *nullBackend) Forward(b *forward.Batch, logits []float32) error {
	for i := range b.LogitRows {
		copy(logits[i*len(n.row):], n.row)
	}
	return nil
}
func (n *nullBackend) CopyBlocks(src, dst, slots []int32) error { return nil }
func (n *nullBackend) NumBlocks() int                           { return n.numBlocks }
func (n *nullBackend) BlockSize() int                           { return n.bs }
func (n *nullBackend) VocabSize() int                           { return len(n.row) }
func (n *nullBackend) Close() error                             { return nil }

// nullDraws is nullBackend drawing "on the device": every draw returns
// its forced token or the row's argmax at no cost, so a benchmark on it
// measures the engine goroutine's own work on the device-draw path.
type nullDraws struct {
	nullBackend
	lse []float32
}

func (n *nullDraws) DrawVocab() bool                              { return true }
func (n *nullDraws) RegisterMask(allowed []uint64) (int32, error) { return 0, nil }
func (n *nullDraws) LogSumExp() []float32                         { return n.lse }
func (n *nullDraws) ForwardDraw(b *forward.Batch, d []forward.Draw, out []forward.Drawn, host []int32, logits []float32) error {
	for len(n.lse) < len(b.LogitRows) {
		n.lse = append(n.lse, 9)
	}
	n.lse = n.lse[:len(b.LogitRows)]
	best := int32(0)
	for i, v := range n.row {
		if v > n.row[best] {
			best = int32(i)
		}
	}
	for i := range d {
		out[i] = forward.Drawn{Tok: best, Logit: n.row[best]}
		if d[i].Force >= 0 {
			out[i] = forward.Drawn{Tok: d[i].Force, Logit: n.row[d[i].Force]}
		}
	}
	for k := range host {
		copy(logits[k*len(n.row):], n.row)
	}
	return nil
}

// BenchmarkEngineOverhead: 128 concurrent requests (8 prompt tokens, 32
// generated, greedy or top-p sampling) over a vocabulary of 6000 on a
// backend that does nothing; ns/token is the engine's own cost per
// generated token. The users=256 cases are a large decode batch (256
// sequences per step, vocabulary 6294 as shipped): greedy, and
// couplet-like sampling (temperature 0.8, top-p 0.95, a read-only
// processor masking a tenth of the vocabulary, like couplet's
// constraints), where per-row sampling is nearly all of the engine's work.
func BenchmarkEngineOverhead(b *testing.B) {
	const promptLen, genLen = 8, 32
	// A peaked, Zipf-like row as a trained language model gives: the token
	// of rank r (a fixed shuffle) has logit 8 − 2.5·ln(1+r).
	zipf := func(vocab int) []float32 {
		row := make([]float32, vocab)
		for r, tok := range rand.New(rand.NewPCG(1, 2)).Perm(vocab) {
			row[tok] = float32(8 - 2.5*math.Log(1+float64(r)))
		}
		return row
	}
	mask := func(int) sampler.LogitsProcessor {
		return sampler.LogitsProcessorFunc(func(_ []int32, l []float32) error {
			for i := 0; i < len(l); i += 10 {
				l[i] = float32(math.Inf(-1))
			}
			return nil
		})
	}
	cases := []struct {
		name         string
		users, vocab int
		temp, topP   float32
		proc         func(int) sampler.LogitsProcessor
	}{
		{"temperature=0", 128, 6000, 0, 0.9, nil},
		{"temperature=0.8", 128, 6000, 0.8, 0.9, nil},
		{"users=256/greedy", 256, 6294, 0, 0, nil},
		{"users=256/couplet", 256, 6294, 0.8, 0.95, mask},
		// The H200's regime: thousands of sequences per step, where the
		// engine goroutine's serial work per sequence bounds a step.
		{"users=2048/greedy", 2048, 6294, 0, 0, nil},
		// The same on the device-draw path (nullDraws): what is left on
		// the host when the GPU draws.
		{"users=2048/device-draws", 2048, 6294, 0.8, 0.95, nil},
		// With couplet-like rules: runs of three forced tokens in every
		// six, jumped forward or one step each.
		{"users=2048/device-draws/forced-runs", 2048, 6294, 0.8, 0.95, forcedRuns(6294)},
		{"users=2048/device-draws/forced-runs/no-jump", 2048, 6294, 0.8, 0.95, forcedRuns(6294)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.SamplingWorkers = benchSamplingWorkers(b)
			// Room for every user in one step (the H200 server's wide flags).
			cfg.MaxNumSeqs = max(cfg.MaxNumSeqs, c.users)
			cfg.MaxQueue = max(cfg.MaxQueue, c.users)
			cfg.MaxNumBatchedTokens = max(cfg.MaxNumBatchedTokens, 8*c.users)
			cfg.noJump = strings.HasSuffix(c.name, "no-jump")
			nb := nullBackend{numBlocks: 2 * c.users * (promptLen + genLen) / 16, bs: 16, row: zipf(c.vocab)}
			var fb forward.Backend = &nb
			if strings.Contains(c.name, "device-draws") {
				fb = &nullDraws{nullBackend: nb}
			}
			e, err := New(fb, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			reqs := benchRequests(c.users, c.vocab, promptLen, genLen)
			for _, r := range reqs {
				r.Params.Temperature, r.Params.TopP, r.Params.Seed = c.temp, c.topP, 1
				r.NewProcessor = c.proc
			}
			c0 := cpuTime()
			for b.Loop() {
				runAll(b, e, reqs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(c.users*genLen*b.N), "ns/token")
			b.ReportMetric(float64((cpuTime()-c0).Nanoseconds())/float64(c.users*genLen*b.N), "cpu-ns/token")
		})
	}
}

// forcedRuns is runProc over vocab without dead ends or stops.
func forcedRuns(vocab int) func(int) sampler.LogitsProcessor {
	set := sampler.NewIDSet(vocab, func(id int32) bool { return id%3 != 1 })
	return func(int) sampler.LogitsProcessor { return runProc{set, vocab, -1, 0, 0} }
}
