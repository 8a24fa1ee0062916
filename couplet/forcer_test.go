package couplet

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"chunlian/engine"
	"chunlian/model"
	"chunlian/sampler"
)

// processOnly hides a processor's Forced method, so that the sampler takes
// its full path (copy, Process, scans, draw) on forced rows too.
type processOnly struct{ p sampler.LogitsProcessor }

func (p processOnly) Process(g []int32, l []float32) error { return p.p.Process(g, l) }

// noForcer wraps an engine so that no request's processor is a Forcer.
type noForcer struct{ engine.Engine }

func (x noForcer) Generate(ctx context.Context, r *engine.Request) (*engine.Result, error) {
	if r.NewProcessor != nil {
		inner := r.NewProcessor
		r.NewProcessor = func(i int) sampler.LogitsProcessor { return processOnly{inner(i)} }
	}
	return x.Engine.Generate(ctx, r)
}

// forcerOnly hides a processor's Mask method (keeping Forced), so that the
// engine does not jump forward over forced runs: each forced token takes
// a step of its own, and the rows keep the full path's batch shapes.
type forcerOnly struct{ p sampler.LogitsProcessor }

func (p forcerOnly) Process(g []int32, l []float32) error { return p.p.Process(g, l) }

func (p forcerOnly) Forced(g []int32, l []float32) (int32, bool) {
	if f, ok := p.p.(sampler.Forcer); ok {
		return f.Forced(g, l)
	}
	return 0, false
}

// noJump wraps an engine so that no request's processor is a Masker.
type noJump struct{ engine.Engine }

func (x noJump) Generate(ctx context.Context, r *engine.Request) (*engine.Result, error) {
	if r.NewProcessor != nil {
		inner := r.NewProcessor
		r.NewProcessor = func(i int) sampler.LogitsProcessor { return forcerOnly{inner(i)} }
	}
	return x.Engine.Generate(ctx, r)
}

// recorder wraps an engine and logs every request's samples: prompt, seed,
// then per completion its tokens, finish and log-prob bits.
type recorder struct {
	engine.Engine
	mu  sync.Mutex
	log []string
}

func (r *recorder) Generate(ctx context.Context, req *engine.Request) (*engine.Result, error) {
	res, err := r.Engine.Generate(ctx, req)
	var b strings.Builder
	fmt.Fprintf(&b, "prompt %v seed %d n %d err %v\n", req.Prompt, req.Params.Seed, req.Params.N, err)
	if res != nil {
		for _, c := range res.Completions {
			fmt.Fprintf(&b, "  %d %s %v", c.Index, c.Finish, c.Tokens)
			for _, lp := range c.LogProbs {
				fmt.Fprintf(&b, " %08x", math.Float32bits(lp))
			}
			b.WriteByte('\n')
		}
	}
	r.mu.Lock()
	r.log = append(r.log, b.String())
	r.mu.Unlock()
	return res, err
}

// sorted returns the log sorted (concurrent 横批 requests finish in any order).
func (r *recorder) sorted() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := slices.Clone(r.log)
	sort.Strings(s)
	return s
}

// TestForcerEquivalence: whole seeded couplets come out the same with the
// sampler's Forcer path as with the full path on every forced row: the
// same couplets (text, score bits) and, underneath, every engine request's
// tokens, finish reasons and log-prob bits. On the paged engine with the
// random test model and with the shipped model (one couplet per request:
// concurrent 横批 requests would batch differently from run to run, and
// the CPU forward's rounding depends on the batch), and on the fake engine
// (exact per-context rows: several couplets per request). Each path has an
// engine of its own, so that both see the same prefix-cache hits (a hit
// changes which rows a step computes, and so the rounding). Both run one
// step per forced token (noJump); a third engine jumps forward over the
// forced runs as the service does, and must give the same couplets, their
// scores equal up to that rounding (a chunk's rows round differently from
// one-token steps).
func TestForcerEquivalence(t *testing.T) {
	type stack struct {
		name            string
		m               *model.Model
		e, eFull, eJump engine.Engine
		maxN            int
		// finish draws 5 上联s and finishes the best 3 in requests of
		// their own (the service's pipeline under load), whose forced
		// <sep> the engine jumps before their first step. Those run
		// side by side, so their batches, and the CPU's rounding, differ
		// between the paths: scores are compared to 1e-6, not bitwise.
		finish bool
	}
	fake := &fakeEngine{vocab: testModel.Tok.Size()}
	stacks := []stack{
		{"fake", testModel, fake, fake, fake, 3, false},
		{"random-model", testModel, realStack(t, testModel), realStack(t, testModel), realStack(t, testModel), 1, false},
	}
	if m, err := model.Default(); err == nil {
		stacks = append(stacks, stack{"default-model", m, realStack(t, m), realStack(t, m), realStack(t, m), 1, false},
			stack{"default-model/finishers", m, realStack(t, m), realStack(t, m), realStack(t, m), 1, true})
	} else {
		t.Logf("default model not available: %v", err)
	}
	for _, st := range stacks {
		t.Run(st.name, func(t *testing.T) {
			var opts []Option
			if st.m == testModel {
				opts = []Option{WithBannerSources(), WithBanners("五福临门", "万象更新", "吉星高照", "春回大地", "国泰民安", "福满人间", "平安吉祥", "富贵吉祥")}
			} else {
				opts = []Option{WithBannerSources(testBannerSources()...)}
			}
			if st.finish {
				opts = append(opts, WithOversample(5), WithFinishers(3))
			}
			recFast, recFull := &recorder{Engine: noJump{st.e}}, &recorder{Engine: noForcer{st.eFull}}
			gFast, err := New(st.m, recFast, opts...)
			if err != nil {
				t.Fatal(err)
			}
			gJump, err := New(st.m, st.eJump, opts...)
			if err != nil {
				t.Fatal(err)
			}
			gFull, err := New(st.m, recFull, opts...)
			if err != nil {
				t.Fatal(err)
			}
			kws := usableKeywords(t, gFast)
			uppers := []string{"春回大地", "天增岁月人增寿", "月照人照月", "春风入户，福气满门"}
			var reqs []Request
			for seed := uint64(1); seed <= 24; seed++ {
				req := Request{Text: kws[int(seed)%len(kws)], Seed: seed, N: 1 + int(seed)%st.maxN}
				switch seed % 4 {
				case 1:
					req.Mode = ModeAcrostic
					req.Length = []int{5, 7, 9}[seed%3]
				case 2:
					req.Mode = ModeLower
					req.Text = uppers[int(seed/4)%len(uppers)]
				case 3:
					req.Length = []int{4, 7, 11}[seed%3]
				}
				switch seed % 6 {
				case 1:
					req.TopK = 1 // greedy
				case 2:
					req.Temperature, req.TopP, req.TopK = 1, 1, 0
				case 3:
					req.Temperature, req.TopK = 0.6, 20
				}
				if gFast.Validate(req) == nil {
					reqs = append(reqs, req)
				}
			}
			if len(reqs) < 16 {
				t.Fatalf("only %d valid requests", len(reqs))
			}
			got := 0
			for _, req := range reqs {
				a, errA := gFast.Generate(context.Background(), req)
				b, errB := gFull.Generate(context.Background(), req)
				if (errA == nil) != (errB == nil) || (errA != nil && errA.Error() != errB.Error()) {
					t.Fatalf("%+v: error %v, full path %v", req, errA, errB)
				}
				if len(a) != len(b) {
					t.Fatalf("%+v: %d couplets, full path %d", req, len(a), len(b))
				}
				for i := range a {
					same := math.Float64bits(a[i].Score) == math.Float64bits(b[i].Score)
					if st.finish {
						same = math.Abs(a[i].Score-b[i].Score) <= 1e-6
					}
					if a[i].Upper != b[i].Upper || a[i].Lower != b[i].Lower || a[i].Banner != b[i].Banner || !same {
						t.Errorf("%+v: couplet %d %+v, full path %+v", req, i, a[i], b[i])
					}
				}
				c, errC := gJump.Generate(context.Background(), req)
				if (errA == nil) != (errC == nil) || len(c) != len(a) {
					t.Fatalf("%+v: %d couplets (error %v), with jump-forward %d (%v)", req, len(a), errA, len(c), errC)
				}
				for i := range a {
					if a[i].Upper != c[i].Upper || a[i].Lower != c[i].Lower || a[i].Banner != c[i].Banner ||
						math.Abs(a[i].Score-c[i].Score) > 1e-6 {
						t.Errorf("%+v: couplet %d %+v, with jump-forward %+v", req, i, a[i], c[i])
					}
				}
				got += len(a)
			}
			la, lb := recFast.sorted(), recFull.sorted()
			if len(la) != len(lb) {
				t.Fatalf("%d engine requests, full path %d", len(la), len(lb))
			}
			for i := range la {
				if la[i] != lb[i] && !st.finish {
					t.Fatalf("engine request differs:\n%s\nfull path:\n%s", la[i], lb[i])
				}
			}
			how := "identical"
			if st.finish {
				how = "alike"
			}
			t.Logf("%d requests, %d couplets, %d engine requests %s", len(reqs), got, len(la), how)
			if got == 0 {
				t.Fatal("no couplet generated")
			}
		})
	}
}

// TestForcedBannerForced: the forced 横批 processor's Forced agrees with its
// Process, whichever of the two assigns the slots first, on a row with
// NaN and -Inf first characters (which both must skip).
func TestForcedBannerForced(t *testing.T) {
	const V, k = 60, 5
	pool := make([]*bannerCand, 12) // first ids 0..11
	for i := range pool {
		pool[i] = &bannerCand{ids: [4]int32{int32(i), 20 + int32(i), 40, 50 + int32(i%3)}}
	}
	row := make([]float32, V)
	for i := range row {
		row[i] = float32(i%7) - 3
	}
	row[6], row[0], row[11] = float32(math.NaN()), negInf, float32(math.NaN())
	clean := slices.Clone(row) // what Process sees: NaN → -Inf
	for i, v := range clean {
		if v != v {
			clean[i] = negInf
		}
	}
	byForced, byProcess := &bannerAssign{pool: pool, k: k}, &bannerAssign{pool: pool, k: k}
	// Peek: the same steps on a row holding only the peeked logits (the
	// device-draw path's row) give the same assignment and tokens.
	byPeek := &bannerAssign{pool: pool, k: k}
	var pm sampler.Mask
	if (forcedBanner{byPeek, 0}).Mask(nil, &pm) || len(pm.Peek) != len(pool) {
		t.Fatalf("Mask before the assignment: peek %v", pm.Peek)
	}
	ids := pm.Peek
	sparse := make([]float32, V)
	for i := range sparse {
		sparse[i] = negInf
	}
	for _, id := range ids {
		sparse[id] = row[id]
	}
	var m sampler.Mask
	if (forcedBanner{byForced, 0}).Mask(nil, &m) {
		t.Fatal("Mask describes a step before the slots are assigned (it needs the row)")
	}
	for slot := range k + 2 {
		f, p := forcedBanner{byForced, slot}, forcedBanner{byProcess, slot}
		var gen []int32
		for step := range 6 {
			id, ok := f.Forced(gen, row)
			if !ok {
				t.Fatalf("slot %d step %d: not forced", slot, step)
			}
			if pid, pok := (forcedBanner{byPeek, slot}).Forced(gen, sparse); !pok || pid != id {
				t.Fatalf("slot %d step %d: Forced on the peeked row %d, on the whole row %d", slot, step, pid, id)
			}
			// Once assigned, Mask says what Forced says.
			if !f.Mask(gen, &m) || !m.Forced || m.Force != id {
				t.Fatalf("slot %d step %d: Mask %+v, Forced %d", slot, step, m, id)
			}
			l := slices.Clone(clean)
			err := p.Process(gen, l)
			f2 := slices.Clone(clean)
			if err2 := sampler.Force(f2, id); err2 != err || sameRow(f2, l) >= 0 {
				t.Fatalf("slot %d step %d: Forced %d (err %v), Process err %v", slot, step, id, err2, err)
			}
			if err != nil {
				if slot < k && step < 4 {
					t.Fatalf("slot %d step %d: dead end", slot, step)
				}
				break
			}
			gen = append(gen, id)
		}
	}
	if !slices.Equal(byForced.slots, byPeek.slots) {
		t.Fatalf("assigned %v from the whole row, %v from the peeked logits", byForced.slots, byPeek.slots)
	}
	if !slices.Equal(byForced.slots, byProcess.slots) || len(byForced.slots) != k {
		t.Fatalf("assigned %v by Forced, %v by Process", byForced.slots, byProcess.slots)
	}
	for _, s := range byForced.slots {
		if s[0] == 0 || s[0] == 6 || s[0] == 11 {
			t.Fatalf("assigned %v: a -Inf/NaN first character", byForced.slots)
		}
	}
}

// BenchmarkDefaultForcer: whole couplets on the shipped model with the
// service defaults, with the sampler's Forcer path ("forcer") and with it
// hidden ("full": every forced row copied, processed and scanned), the two
// interleaved in one run: ten concurrent users (CPU time per couplet,
// couplets/s) and one couplet at a time (per-stage wall time).
func BenchmarkDefaultForcer(b *testing.B) {
	variants := []struct {
		name string
		wrap func(engine.Engine) engine.Engine
	}{
		{"forcer", nil},
		{"full", func(e engine.Engine) engine.Engine { return noForcer{e} }},
	}
	for _, v := range variants {
		b.Run("Concurrent10/"+v.name, func(b *testing.B) { benchConcurrent10(b, v.wrap) })
	}
	for _, v := range variants {
		b.Run("Stages/"+v.name, func(b *testing.B) {
			benchStagesOn(b, v.wrap, WithOversample(1), WithBannerSources(testBannerSources()...))
		})
	}
}
