package couplet

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"

	"chunlian/engine"
	"chunlian/sampler"
)

// The 横批 stage. For each picked couplet one engine request continues the
// couplet's context after <ban> (prompt + 上联 <sep> 下联 <ban>; the lines'
// full KV blocks are in the prefix cache from the candidate request, so only
// the partial last block is recomputed) with k samples that fork there and
// decode as one batch, each forced through one retrieved candidate (a real
// phrase). Only when retrieval finds nothing does a single sample write the
// model's own 横批 (four Chinese characters, at the request's temperature).
//
// Every sample's four raw log-probs are log P(B1..B4 | couplet); the best sum
// wins. <eos> is not scored: the model ends a four-character 横批 with it
// almost surely, and BenchmarkBannerQuality found the choice identical with
// and without it, so scoring it would cost one more step and k+1 more rows.
//
// Which k retrieved candidates: the lexical prefilter (topBanners) passes a
// pool of bannerPool, narrowed to the candidates sharing the most
// characters with the couplet (sharedTier); at the first step, every
// sample's processor sees the same logits row (the one at <ban>), which
// gives log P(B1) of every pool candidate up to a shared constant; the k
// with the highest are assigned to the forced samples (bannerAssign). This
// costs no forward rows and, per BenchmarkBannerQuality, 4 chosen out of 32
// rank as well as the old 8 lexical candidates scored in full.

// bannerAssign hands the pool's k most likely candidates (by B1's logit at
// <ban>) to the forced samples. The first processor call of any sample
// assigns all slots; every sample's first call sees the same row, so the
// result does not depend on which sample the engine runs first.
// Ownership: processors run on the engine goroutine (or, for engines that
// run samples on several goroutines, under mu), so mu is uncontended.
type bannerAssign struct {
	pool []*bannerCand // lexical prefilter order
	k    int

	mu    sync.Mutex
	slots [][4]int32 // [≤k] assigned candidates, nil until the first call
	done  bool
}

func (a *bannerAssign) slot(i int, row []float32) ([4]int32, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.done {
		a.done = true
		a.slots = assignByFirstChar(a.pool, row, a.k)
	}
	if i < 0 || i >= len(a.slots) {
		return [4]int32{}, false
	}
	return a.slots[i], true
}

// assigned is slot without assigning: ok reports that slot i holds a
// candidate, done that the assignment was made (by an earlier slot call).
func (a *bannerAssign) assigned(i int) (ids [4]int32, ok, done bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.done {
		return ids, false, false
	}
	if i < 0 || i >= len(a.slots) {
		return ids, false, true
	}
	return a.slots[i], true, true
}

// assignByFirstChar returns the ids of the k pool candidates whose first
// character has the highest logit in row (ties keep pool order; candidates
// whose first character is -Inf or NaN are skipped).
func assignByFirstChar(pool []*bannerCand, row []float32, k int) [][4]int32 {
	// k selection passes, not a sort: k is a few and the pool a few dozen,
	// and this runs on the engine goroutine once per 横批 request.
	out := make([][4]int32, 0, min(k, len(pool)))
	taken := make([]bool, len(pool))
	for range k {
		best := -1
		for i, c := range pool {
			id := c.ids[0]
			if taken[i] || int(id) >= len(row) || !(row[id] > float32(math.Inf(-1))) {
				continue
			}
			if best < 0 || row[id] > row[pool[best].ids[0]] {
				best = i
			}
		}
		if best < 0 {
			break
		}
		taken[best] = true
		out = append(out, pool[best].ids)
	}
	return out
}

// forcedBanner is the processor of forced sample slot+1.
type forcedBanner struct {
	a    *bannerAssign
	slot int
}

func (f forcedBanner) Process(gen []int32, logits []float32) error {
	id, _ := f.Forced(gen, logits)
	return sampler.Force(logits, id)
}

// Mask implements sampler.Masker once the slots are assigned. The step
// that assigns them reads the row, so it declines, but only at the pool
// candidates' first characters (assignByFirstChar), and the forced token
// is one of them: it lists those in m.Peek (8 bytes each from the GPU
// instead of the row).
func (f forcedBanner) Mask(gen []int32, m *sampler.Mask) bool {
	m.Reset()
	ids, ok, done := f.a.assigned(f.slot)
	if !done {
		for _, c := range f.a.pool {
			m.Peek = append(m.Peek, c.ids[0])
		}
		return false
	}
	m.Forced, m.Force = true, -1
	if ok && len(gen) < len(ids) {
		m.Force = ids[len(gen)]
	}
	return true
}

// Forced implements sampler.Forcer: every step is forced, to the slot's
// candidate's next character, or to -1 (outside every row: a dead end)
// when the pool has fewer candidates than samples or the four are written.
// Its first call (or Process's) may assign the slots from logits; the raw
// row the sampler passes here and the processed copy Process sees give
// the same assignment (NaN and -Inf entries are both skipped).
func (f forcedBanner) Forced(gen []int32, logits []float32) (int32, bool) {
	ids, ok := f.a.slot(f.slot, logits)
	if !ok || len(gen) >= len(ids) {
		return -1, true // fewer candidates than samples
	}
	return ids[len(gen)], true
}

// chooseBanners gives every chosen couplet its 横批 (see above) and adds
// bannerWeight × the banner's mean log-prob to its score, except that a
// request for one couplet whose pool holds one candidate takes it without a
// request (its score then has no banner term). Couplets are served
// concurrently, so the engine batches their requests too. It returns the
// couplets that got a 横批 passing every rule (a couplet is dropped only if
// its request yields no usable 横批); engine errors and ctx end are
// returned as they are, except that a refused 横批 request falls back to
// the most relevant retrieved 横批 (fallbackBanner).
func (g *Generator) chooseBanners(ctx context.Context, p *plan, prompt []int32, chosen []*candidate, tr *Trace) ([]*candidate, error) {
	eng := g.engine(p)
	stage := startStage(tr, eng, StageBannerRetrieval)
	pools := make([][]*bannerCand, len(chosen)) // [len(chosen)][≤bannerPool]
	if g.o.bannerTopK > 0 {
		head := g.t.text(prompt) // the same for every chosen couplet
		for ci, cd := range chosen {
			bc := newBannerContext(head + cd.c.Upper + cd.c.Lower)
			pools[ci] = sharedTier(topBanners(g.banners, bc, g.o.bannerPool), bc)
		}
	}
	stage.end()
	stage = startStage(tr, eng, StageBannerScoring)
	defer stage.end()

	errs := make([]error, len(chosen)) // [len(chosen)], slot i written by goroutine i only
	ok := make([]bool, len(chosen))    // likewise
	var wg sync.WaitGroup
	for ci, cd := range chosen {
		if len(pools[ci]) == 1 && p.n == 1 {
			// One candidate in the tier: the choice is made, and scoring it
			// would only add its log-prob to the score, which orders the
			// couplets of a request with several.
			cd.c.Banner = pools[ci][0].text
			ok[ci] = Check(cd.c.Upper, cd.c.Lower, cd.c.Banner).Rule4()
			continue
		}
		req, assign, own := g.bannerRequest(p, prompt, cd, pools[ci])
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := eng.Generate(ctx, req)
			if err != nil {
				// The lines are already paid for: on an engine refusal
				// (queue full, closed) fall back to the most relevant
				// retrieved 横批, unscored, rather than fail the couplet.
				if ctx.Err() == nil {
					if fb := fallbackBanner(pools[ci], g.banners, g.t.text(prompt)+cd.c.Upper+cd.c.Lower); fb != nil {
						cd.c.Banner = fb.text
						ok[ci] = Check(cd.c.Upper, cd.c.Lower, cd.c.Banner).Rule4()
						return
					}
				}
				errs[ci] = err
				return
			}
			stage.addResult(res)
			best, bestScore := g.pickBanner(res.Completions, assign, own == 0, cd.c.Upper, cd.c.Lower)
			if best == nil {
				return
			}
			cd.c.Banner = g.t.text(best)
			cd.c.Score += bannerWeight * bestScore / 4
			ok[ci] = Check(cd.c.Upper, cd.c.Lower, cd.c.Banner).Rule4()
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*candidate
	for ci, cd := range chosen {
		if ok[ci] {
			out = append(out, cd)
		}
	}
	if len(out) == 0 {
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// bannerRequest is the 横批 request of one chosen couplet: prompt + (上联
// <sep> if generated) + 下联 + <ban>, then either the model's own 横批
// (own = 1, when nothing is retrieved: a free 横批 is often a made-up
// variant of an idiom) or the k candidates of pool that assign forces,
// one per sample.
func (g *Generator) bannerRequest(p *plan, prompt []int32, cd *candidate, pool []*bannerCand) (req *engine.Request, assign *bannerAssign, own int) {
	sp := g.t.sp
	full := slices.Clone(prompt)
	if p.mode != ModeLower {
		full = append(full, cd.upperIDs...)
		full = append(full, sp.Sep)
	}
	full = append(full, cd.lowerIDs...)
	full = append(full, sp.Banner)
	k := min(g.o.bannerTopK, len(pool))
	assign = &bannerAssign{pool: pool, k: k}
	if k == 0 {
		own = 1
	}
	req = &engine.Request{
		Prompt:   full,
		From:     cd.handle, // the couplet's kept sample, when the engine kept it
		FollowUp: true,
		Final:    true, // no request continues a 横批
		Params: sampler.Params{
			Temperature: p.temp, TopP: p.topP, TopK: p.topK,
			MaxTokens: 4, N: own + k,
			Seed: bannerSeed(p.seed, cd.attempt, cd.sample),
		},
		NewProcessor: func(i int) sampler.LogitsProcessor {
			if own == 1 {
				return bannerProc{t: g.t}
			}
			return forcedBanner{a: assign, slot: i}
		},
	}
	if p.onToken != nil {
		att, smp := cd.attempt, cd.sample
		req.OnEvent = func(ev engine.Event) {
			if ev.Index != 0 || own == 0 || ev.Done || ev.Token < 0 || int(ev.Token) >= len(g.t.char) || g.t.char[ev.Token] == 0 {
				return
			}
			p.onToken(TokenEvent{Attempt: att, Sample: smp, Part: PartBanner, Text: string(g.t.char[ev.Token])})
		}
	}
	return req, assign, own
}

// pickBanner returns the 横批 request's winning sample: the highest sum of
// the four log-probs among the complete ones (a forced sample counts only
// if it wrote its assigned candidate). A 横批 that repeats four characters
// of the 上联 or 下联 (the model likes 幸福人家 under 幸福人家日日欢) says
// nothing the lines do not, so it wins only when every complete sample
// does that. nil when no sample is complete.
func (g *Generator) pickBanner(comps []engine.Completion, assign *bannerAssign, forced bool, upper, lower string) ([]int32, float64) {
	var best, bestCopy []int32
	bestScore, bestCopyScore := math.Inf(-1), math.Inf(-1)
	for _, comp := range comps {
		if comp.Finish != engine.FinishLength || len(comp.Tokens) != 4 || len(comp.LogProbs) != 4 {
			continue // a forced sample without a candidate, or a dead end
		}
		if forced {
			ids, ok := assign.slot(comp.Index, nil)
			if !ok || !slices.Equal(comp.Tokens, ids[:]) {
				continue
			}
		}
		s := 0.0
		for _, v := range comp.LogProbs {
			s += float64(v)
		}
		if text := g.t.text(comp.Tokens); strings.Contains(upper, text) || strings.Contains(lower, text) {
			if s > bestCopyScore {
				bestCopy, bestCopyScore = comp.Tokens, s
			}
		} else if s > bestScore {
			best, bestScore = comp.Tokens, s
		}
	}
	if best == nil {
		return bestCopy, bestCopyScore
	}
	return best, bestScore
}

// bannerSeed gives each candidate's 横批 request its own non-zero seed.
func bannerSeed(seed uint64, attempt, sample int) uint64 {
	s := seedFor(seed, attempt) ^ uint64(sample+1)*0xBF58476D1CE4E5B9
	if s == 0 {
		s = 1
	}
	return s
}

// fallbackBanner is the 横批 used when the 横批 request fails: the pool's
// most relevant candidate (the retrieval lists' when no pool was built), or
// nil without retrieval lists.
func fallbackBanner(pool []*bannerCand, all []bannerCand, text string) *bannerCand {
	if len(pool) > 0 {
		return pool[0]
	}
	if top := topBanners(all, newBannerContext(text), 1); len(top) > 0 {
		return top[0]
	}
	return nil
}
