package sampler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"

	"chunlian/kernels/cpu"
)

// Sampler draws the tokens of one sequence (one sample of one request). It is
// not safe for concurrent use: one goroutine at a time calls it, once per
// step of its sequence (the engine runs different sequences' Samplers on
// different worker goroutines, each with its own Scratch).
//
// Zero values of the optional parameters mean "off": TopK ≤ 0, TopP ≤ 0 or
// ≥ 1, MinP ≤ 0 and RepetitionPenalty ≤ 0 or == 1 all disable their stage, so
// a zero Params is plain greedy decoding.
type Sampler struct {
	p   Params
	rng *rand.Rand
	own *Scratch // Sample's and SampleLSE's buffers, made on first use
}

// Scratch holds the vocabulary-sized buffers one Sample call works in. A
// Scratch may serve any number of Samplers, one call at a time: the engine
// keeps one per worker goroutine instead of one per sequence (V floats ×
// 4 buffers per sequence would be ~100 KB each at V = 6294, and a
// worker's single set stays in its core's cache). Nothing in it carries
// over from one call to the next except the dedup generation counter.
type Scratch struct {
	work  []float32 // [V] logits after processors, penalty and temperature
	probs []float32 // [≤V] unnormalised softmax(work / T) of the candidates, packed like cand
	lse   []float32 // [V] scratch of logSumExp
	cand  []int32   // [V] candidate token ids, ascending
	vals  []float32 // [V] their logits, packed like cand
	pos   []int32   // [V] positions into cand still allowed
	iota  []int32   // [V] 0, 1, 2, …
	top   []int32   // [V] the heaviest candidates (presort's fast path)
	stamp []uint32  // [V] repetition-penalty dedup marks (== gen means seen)
	gen   uint32
	// sortPrefix's buckets and keys for top-k/top-p (presort), made on
	// first use.
	bmass  []float64 // [maxBuckets] probability mass per bucket
	bcount []int32   // [maxBuckets+1] tokens per bucket, then offsets
	keys   []uint64  // [V] sortKey of the candidates
	ord    []uint64  // [V] the keys bucketed, then sorted
	bk     bucketState
}

// NewScratch returns an empty Scratch; it grows to the vocabulary on first
// use.
func NewScratch() *Scratch { return new(Scratch) }

// grow makes every [V] buffer at least V long.
func (sc *Scratch) grow(V int) {
	if cap(sc.work) < V {
		sc.work = make([]float32, V)
		sc.probs = make([]float32, V)
		sc.cand = make([]int32, V)
		sc.vals = make([]float32, V)
		sc.pos = make([]int32, V)
		sc.iota = make([]int32, V)
		for i := range sc.iota {
			sc.iota[i] = int32(i)
		}
		sc.top = make([]int32, V)
		sc.stamp = make([]uint32, V)
		sc.lse = make([]float32, V)
		sc.gen = 0
	}
}

// LogSumExp is the package's LogSumExp computed in sc's buffers (no pool
// round trip); the result is bit-identical.
func (sc *Scratch) LogSumExp(row []float32) float64 {
	sc.grow(len(row))
	return logSumExp(row, sc.lse[:len(row)])
}

// New returns the sampler of sample index of a request with parameters p.
// Its random stream is PCG(seed, index): samples of one request differ, and
// the same (seed, index) replays the same stream. Seed 0 draws a random seed.
func New(p Params, index int) *Sampler {
	seed := p.Seed
	if seed == 0 {
		seed = rand.Uint64() | 1
	}
	return &Sampler{p: p, rng: rand.New(rand.NewPCG(seed, uint64(index)))}
}

// Params returns the parameters the sampler was built with.
func (s *Sampler) Params() Params { return s.p }

// Validate reports parameters that cannot be sampled with.
func Validate(p Params) error {
	switch {
	case math.IsNaN(float64(p.Temperature)) || p.Temperature < 0:
		return fmt.Errorf("sampler: temperature %v must be ≥ 0", p.Temperature)
	case math.IsNaN(float64(p.TopP)) || p.TopP < 0:
		return fmt.Errorf("sampler: top_p %v must be in [0, 1]", p.TopP)
	case math.IsNaN(float64(p.MinP)) || p.MinP < 0 || p.MinP > 1:
		return fmt.Errorf("sampler: min_p %v must be in [0, 1]", p.MinP)
	case math.IsNaN(float64(p.RepetitionPenalty)) || p.RepetitionPenalty < 0:
		return fmt.Errorf("sampler: repetition_penalty %v must be > 0", p.RepetitionPenalty)
	case p.TopK < 0:
		return fmt.Errorf("sampler: top_k %d must be ≥ 0", p.TopK)
	case p.MaxTokens < 0:
		return fmt.Errorf("sampler: max_tokens %d must be ≥ 0", p.MaxTokens)
	case p.N < 0:
		return fmt.Errorf("sampler: n %d must be ≥ 1", p.N)
	}
	return nil
}

// negligible is the log-ratio to the max below which a token is never
// drawn: e^-24 ≈ 4e-11, it would be picked less than once in 10¹⁰ draws.
const negligible = -24

var scratchPool = sync.Pool{New: func() any { return new([]float32) }}

// LogSumExp returns log Σ exp(row[i]), ignoring NaNs; -Inf for an all -Inf row.
func LogSumExp(row []float32) float64 {
	bp := scratchPool.Get().(*[]float32)
	if cap(*bp) < len(row) {
		*bp = make([]float32, len(row))
	}
	lse := logSumExp(row, (*bp)[:len(row)])
	scratchPool.Put(bp)
	return lse
}

// logSumExp computes LogSumExp with scratch ([len(row)]).
func logSumExp(row, scratch []float32) float64 {
	m, im, hasNaN := scanMax(row)
	return lseFrom(row, scratch, m, im, hasNaN)
}

// scanMax returns the largest entry of row, the first index holding it and
// whether row has NaNs (which it skips); m is -Inf and im 0 when no entry
// is above -Inf. It is cpu.ScanMax (vectorised on amd64).
func scanMax(row []float32) (m float32, im int, hasNaN bool) { return cpu.ScanMax(row) }

// lseFrom finishes logSumExp given scanMax's results: lse = m + log Σ
// exp(x−m), the sum from the kernels' vectorised ExpSum (scale 1, shift
// m). Rows with NaNs take a scalar loop.
func lseFrom(row, scratch []float32, m float32, im int, hasNaN bool) float64 {
	if math.IsInf(float64(m), 0) {
		return float64(m)
	}
	if hasNaN {
		var sum float64
		for _, v := range row {
			if v == v {
				sum += float64(expNeg(v - m))
			}
		}
		return float64(m) + math.Log(sum)
	}
	return float64(m) + math.Log(cpu.ExpSum(scratch, row, 1, m))
}

// LogProb returns log softmax(row)[tok].
func LogProb(row []float32, tok int32) float32 {
	return float32(float64(row[tok]) - LogSumExp(row))
}

// Sample picks the next token from one row of raw model logits. prompt and
// generated are the sequence's tokens so far (repetition penalty looks at
// both; the processor sees only generated). row is not modified. The order
// is: processor → dead-end check → repetition penalty → greedy argmax, or
// temperature → top-k → top-p → min-p → draw. It returns the token and its
// raw log-probability log softmax(row)[token].
func (s *Sampler) Sample(row []float32, prompt, generated []int32, proc LogitsProcessor) (int32, float32, error) {
	return s.SampleWith(s.scratch(), row, math.NaN(), prompt, generated, proc)
}

// SampleLSE is Sample with lse = LogSumExp(row) already known (the engine
// computes it once for the n samples that share a row, or takes it from
// the backend).
func (s *Sampler) SampleLSE(row []float32, lse float64, prompt, generated []int32, proc LogitsProcessor) (int32, float32, error) {
	return s.SampleWith(s.scratch(), row, lse, prompt, generated, proc)
}

func (s *Sampler) scratch() *Scratch {
	if s.own == nil {
		s.own = NewScratch()
	}
	return s.own
}

// SampleWith is Sample working in sc, with lse = LogSumExp(row) when known
// and NaN when not (it is then computed). sc must not be in use by another
// goroutine; the same inputs, Sampler state and lse give the same token
// and log-prob whichever Scratch is used. A proc that implements Forcer is
// asked first; when it forces a token, Process is not called and the
// result (token, log-prob, error, random stream) is the one Process's
// forced row would give (sampleForced).
func (s *Sampler) SampleWith(sc *Scratch, row []float32, lse float64, prompt, generated []int32, proc LogitsProcessor) (int32, float32, error) {
	V := len(row)
	if V == 0 {
		return 0, 0, fmt.Errorf("sampler: empty logits row")
	}
	sc.grow(V)
	rp := s.p.RepetitionPenalty
	penalty := rp > 0 && rp != 1
	if f, ok := proc.(Forcer); ok {
		if tok, ok := f.Forced(generated, row); ok {
			return s.sampleForced(sc, row, lse, tok, prompt, generated)
		}
	}
	m, im, hasNaN := scanMax(row)

	// Fast path: nothing edits the row, so it is used as it is (no copy).
	// Greedy is then scanMax's argmax, and the log-sum-exp reuses its max.
	if proc == nil && !penalty && !hasNaN {
		if m == float32(math.Inf(-1)) { // every entry -Inf
			return 0, 0, ErrDeadEnd
		}
		tok := int32(im)
		if s.p.Temperature != 0 {
			tok = s.draw(sc, row, m, int32(im))
		}
		if lse != lse {
			lse = lseFrom(row, sc.lse[:V], m, im, false)
		}
		return tok, float32(float64(row[tok]) - lse), nil
	}

	w := sc.work[:V]
	copy(w, row)
	if hasNaN {
		negInf := float32(math.Inf(-1))
		for i, v := range w {
			if v != v {
				w[i] = negInf
			}
		}
	}
	if proc != nil {
		if err := proc.Process(generated, w); err != nil {
			return 0, 0, err
		}
	}
	if penalty {
		sc.gen++
		if sc.gen == 0 { // wrapped: old marks could collide
			clear(sc.stamp)
			sc.gen = 1
		}
		sc.penalize(w, prompt, rp)
		sc.penalize(w, generated, rp)
	}
	wm, wim, _ := scanMax(w) // w holds no NaN
	if !(wm > float32(math.Inf(-1))) {
		return 0, 0, ErrDeadEnd
	}
	tok := int32(wim)
	if s.p.Temperature != 0 {
		tok = s.draw(sc, w, wm, int32(wim))
	}
	if lse != lse {
		lse = lseFrom(row, sc.lse[:V], m, im, hasNaN)
	}
	return tok, float32(float64(row[tok]) - lse), nil
}

// sampleForced is SampleWith for a row that proc forces to tok (see
// Forcer), computing only what the full path's result depends on. There,
// the processed row w holds v = row[tok] (NaN counts as -Inf) and -Inf
// everywhere else: its max is v at tok, the penalty can only rescale v,
// and the draw gathers the single candidate tok. Here draw runs on the
// one-entry row [v], which takes the same steps on the same values (one
// candidate, the same threshold, ExpSum of the same single value, the
// same top-k/top-p/min-p decisions), so it draws from the random stream
// exactly when the full path does and returns its only index.
func (s *Sampler) sampleForced(sc *Scratch, row []float32, lse float64, tok int32, prompt, generated []int32) (int32, float32, error) {
	V := len(row)
	if tok < 0 || int(tok) >= V {
		return 0, 0, ErrDeadEnd
	}
	v := row[tok]
	if !(v > float32(math.Inf(-1))) { // -Inf or NaN: the processor's dead end
		return 0, 0, ErrDeadEnd
	}
	if rp := s.p.RepetitionPenalty; rp > 0 && rp != 1 && (slices.Contains(prompt, tok) || slices.Contains(generated, tok)) {
		v = penalized(v, rp)
		if !(v > float32(math.Inf(-1))) {
			return 0, 0, ErrDeadEnd
		}
	}
	if s.p.Temperature != 0 {
		w := sc.work[:1]
		w[0] = v
		s.draw(sc, w, v, 0)
	}
	if lse != lse {
		lse = logSumExp(row, sc.lse[:V])
	}
	return tok, float32(float64(row[tok]) - lse), nil
}

// penalize applies the HF repetition penalty (positive logits divided,
// negative multiplied) once per distinct token: stamp[t] == gen marks tokens
// already penalised in this Sample call, across prompt and generated.
func (sc *Scratch) penalize(w []float32, toks []int32, rp float32) {
	for _, t := range toks {
		if t < 0 || int(t) >= len(w) || sc.stamp[t] == sc.gen {
			continue
		}
		sc.stamp[t] = sc.gen
		w[t] = penalized(w[t], rp)
	}
}

// penalized is logit v under the HF repetition penalty rp: divided when
// positive, multiplied otherwise.
func penalized(v, rp float32) float32 {
	if v > 0 {
		return v / rp
	}
	return v * rp
}

// draw samples from softmax(w/T) restricted by top-k, top-p and min-p. w
// holds no NaN, m is its maximum (finite) and im the first index of it.
//
// Tokens below e^negligible of the most likely one are never drawn, so
// only the candidates w[i] > m + negligible·T are gathered, with their
// logits, in one vectorised pass (cpu.CompactGreaterVals), and only their
// probabilities are computed: probs[j] = exp(vals[j]/T − m/T) (cpu.ExpSum),
// softmax(w/T) times its sum, the max exactly 1 (so pmax = 1), with the
// candidates' total. Nothing below needs them normalised: the min-p
// threshold is relative to the max, top-p to the candidates' total, and
// the draw scales u by the total. Everything works on positions j into
// the packed arrays (ascending j is ascending token id), so sorting by
// (probability, position) is sorting by (probability, id) as before.
// With top-p or top-k alone (no min-p), drawBucketed draws without
// sorting the kept set where its sums are exact; else kept sorts it.
func (s *Sampler) draw(sc *Scratch, w []float32, m float32, im int32) int32 {
	T := s.p.Temperature
	invT := float32(1)
	if T != 1 {
		invT = 1 / T
	}
	thr := m + negligible*T
	if !(thr < m) { // |m| so large that 24·T is below its rounding
		thr = math.Nextafter32(m, float32(math.Inf(-1)))
	}
	n := cpu.CompactGreaterVals(sc.cand[:len(w)], sc.vals[:len(w)], w, thr)
	probs := sc.probs[:n]
	total := cpu.ExpSum(probs, sc.vals[:n], invT, m*invT)
	if n == 0 || !(total >= 1) {
		// No finite probabilities: the max is +Inf, or w/T overflowed (a
		// tiny T). The max token is the limit of the distribution. (The
		// scalar code before panicked here.)
		return im
	}
	cand := sc.cand[:n]
	topK := s.p.TopK
	topP := float64(s.p.TopP)
	useK := topK > 0 && topK < n
	useP := topP > 0 && topP < 1
	mp := s.p.MinP
	if !useK && !useP && !(mp > 0) {
		return cand[pick(probs, s.rng.Float64()*total)]
	}
	var sel []int32
	if useK != useP && !(mp > 0) {
		// top-k or top-p alone: drawBucketed sorts two buckets instead of
		// the kept set where it can, else the kept prefix is sorted.
		c, sorted := sc.presortFast(sc.iotaPos(n), probs, 1, total, useK, topK, topP)
		if !sorted {
			if j, ok := s.drawBucketed(sc, c, probs, total, n, useK, topK, topP); ok {
				return cand[j]
			}
			c = sc.presortRest(c, probs, total, useK, topK, topP)
		}
		sel = cutSorted(c, probs, total, useK, useP, topK, topP)
	} else {
		sel = s.kept(sc, probs, total)
	}
	if len(sel) != n {
		total = cpu.SumAt(probs, sel)
	}
	u := s.rng.Float64() * total
	for _, j := range sel {
		u -= float64(probs[j])
		if u < 0 {
			return cand[j]
		}
	}
	return cand[sel[len(sel)-1]] // rounding left u ≥ 0 at the end
}

// kept returns the positions into probs (draw's candidates, probs[j] =
// exp(vals[j]/T − m/T), the max 1, total their sum) that top-k, top-p and
// min-p keep, in the order draw walks them: by probability, descending,
// ties by position (sorted only where top-k or top-p is on; ascending
// positions with min-p alone). It works in sc.pos.
func (s *Sampler) kept(sc *Scratch, probs []float32, total float64) []int32 {
	n := len(probs)
	const pmax = 1
	topK := s.p.TopK
	topP := float64(s.p.TopP)
	useK := topK > 0 && topK < n
	useP := topP > 0 && topP < 1
	mp := s.p.MinP
	sel := sc.iotaPos(n)
	if useK || useP {
		sel = sc.presort(sel, probs, pmax, total, useK, topK, topP)
		sel = cutSorted(sel, probs, total, useK, useP, topK, topP)
	}
	if mp > 0 {
		k := sel[:0]
		thr := mp * pmax
		for _, j := range sel {
			if probs[j] >= thr {
				k = append(k, j)
			}
		}
		sel = k
	}
	return sel
}

// iotaPos returns sc.pos[:n] holding 0, 1, …, n−1.
func (sc *Scratch) iotaPos(n int) []int32 {
	sel := sc.pos[:n]
	copy(sel, sc.iota[:n])
	return sel
}

// cutSorted applies top-k (useK) and then top-p (useP) to presort's
// sorted prefix sel.
func cutSorted(sel []int32, probs []float32, total float64, useK, useP bool, topK int, topP float64) []int32 {
	if useK && topK < len(sel) {
		sel = sel[:topK]
	}
	if useP {
		// The nucleus is taken over the mass left after top-k: all of
		// it without top-k (presort may have dropped small tokens).
		kept := total
		if useK {
			kept = 0
			for _, j := range sel {
				kept += float64(probs[j])
			}
		}
		var cum float64
		for i, j := range sel {
			cum += float64(probs[j])
			if cum >= topP*kept {
				sel = sel[:i+1]
				break
			}
		}
	}
	return sel
}

// pick returns the first j with probs[0] + … + probs[j] > u (the last
// index if rounding leaves u ≥ the total). A running u -= probs[j] is a
// chain of dependent float64 subtractions (4 cycles each) over, on a
// row where every token is a candidate, thousands of entries; pick steps
// over whole blocks of 8 (each summed as a tree) and walks one by one only
// inside the block where u falls.
func pick(probs []float32, u float64) int {
	j := 0
	for ; j+8 <= len(probs); j += 8 {
		b := probs[j : j+8 : j+8]
		s := ((float64(b[0]) + float64(b[1])) + (float64(b[2]) + float64(b[3]))) +
			((float64(b[4]) + float64(b[5])) + (float64(b[6]) + float64(b[7])))
		if u < s {
			break
		}
		u -= s
	}
	for ; j < len(probs); j++ {
		u -= float64(probs[j])
		if u < 0 {
			return j
		}
	}
	return len(probs) - 1
}

// presortLevels are the thresholds, relative to the most likely token,
// of presort's fast path; presortMaxSort is the most tokens it sorts
// without histogramming them first.
var presortLevels = [...]float32{1.0 / 64, 1.0 / (1 << 14)}

const presortMaxSort = 256

// presort returns the candidates that can be in the top k (useK) or else in
// the top-p nucleus, sorted by probability (descending, ties by id).
// cand must list every index of probs above e^negligible·pmax (draw
// passes all its candidates). Sorting the whole vocabulary every step
// would dominate sampling (and a histogram of ~2000 candidates cost ~4 µs,
// most of a row's sampling, on peaked rows whose nucleus is a few tokens).
// Fast path: the tokens above pmax·2^-6 (then 2^-14, for top-p alone),
// gathered by one vectorised pass over probs each (cpu.CompactGreater),
// are a prefix of the sorted candidates; when there are at least k of
// them (useK), or they hold topP·total of the mass with a margin against
// rounding, they are all that is needed: sorted at once if there are at
// most presortMaxSort, else passed to sortPrefix instead of the
// candidates. sortPrefix buckets by probability, finds the bucket where
// the count reaches k or the mass topP·total, and sorts only the buckets
// down to it. Either way every dropped token is smaller than every kept
// one, so the sorted prefix is unchanged.
func (sc *Scratch) presort(cand []int32, probs []float32, pmax float32, total float64, useK bool, topK int, topP float64) []int32 {
	cand, sorted := sc.presortFast(cand, probs, pmax, total, useK, topK, topP)
	if sorted {
		return cand
	}
	return sc.presortRest(cand, probs, total, useK, topK, topP)
}

// presortRest sorts the prefix of presortFast's unsorted candidates that
// holds the top k (useK) or the nucleus.
func (sc *Scratch) presortRest(cand []int32, probs []float32, total float64, useK bool, topK int, topP float64) []int32 {
	if useK {
		return sc.sortPrefix(cand, probs, topK, math.Inf(1))
	}
	return sc.sortPrefix(cand, probs, 0, topP*total*(1+1e-6))
}

// presortFast is presort's fast path: the sorted prefix (sorted = true),
// or the candidates still to sort: all of cand, or the fast path's when
// they hold the top k or the nucleus but are more than presortMaxSort.
func (sc *Scratch) presortFast(cand []int32, probs []float32, pmax float32, total float64, useK bool, topK int, topP float64) ([]int32, bool) {
	levels := presortLevels[:]
	if useK {
		// A second level rarely holds k tokens where the first did not
		// (peaked rows): measured a net loss for top-k 50.
		levels = levels[:1]
	}
	for _, q := range levels {
		n, mass := cpu.CompactGreater(sc.top[:len(probs)], probs, pmax*q)
		if (useK && n >= topK) || (!useK && mass >= topP*total*(1+1e-6)) {
			if n <= presortMaxSort {
				return sc.sortPrefix(sc.top[:n], probs, 0, math.Inf(1)), true
			}
			return sc.top[:n], false
		}
	}
	return cand, false
}

// sortKey orders (probability, id) pairs: ascending keys are descending
// probabilities (non-negative float32s order as their bits), ties by
// ascending id.
func sortKey(p float32, id int32) uint64 {
	return uint64(^math.Float32bits(p))<<32 | uint64(uint32(id))
}

// sortSmall is the size up to which sortPrefix sorts the keys at once
// (slices.Sort), and bucketSortMax the largest bucket it insertion-sorts.
const (
	sortSmall     = 48
	bucketSortMax = 32
)

// sortPrefix returns the shortest prefix of cand sorted by probability
// (descending, ties by id: the order of a full sortByProb) that is whole
// buckets (below) and holds at least k tokens (k > 0) and, where
// mass is finite, Σ probs ≥ mass (all of cand when it does not reach
// them). cand's entries are distinct and non-negative; probs ≥ 0, no NaN.
// It is rewritten in place.
//
// The whole order is fixed by the keys (sortKey: ids are distinct), so
// any exact sort gives sortByProb's result; this one is a bucket sort
// (bucketize) instead of a comparison sort with a closure (which dominated
// the service's CPU on flat rows; docs/DECISIONS.md, "Top-p without a full
// sort"): each bucket up to the cut is
// sorted on its own (insertion sort, or slices.Sort past bucketSortMax
// keys), and the rest is never sorted. Bucket sums and a sequential sum
// of the same float32s in sorted order differ by at most ~n·2^-53
// relative, so a caller that needs a prefix whose sequential sum reaches
// S passes mass = S·(1+1e-6).
func (sc *Scratch) sortPrefix(cand []int32, probs []float32, k int, mass float64) []int32 {
	if !sc.bucketize(cand, probs, k, mass) {
		return cand
	}
	bk := &sc.bk
	for d := 0; d <= bk.cut; d++ {
		sortBucket(sc.bucket(d))
	}
	m := int(sc.bcount[bk.cut])
	for i, key := range sc.ord[:m] {
		cand[i] = int32(uint32(key))
	}
	return cand[:m]
}

// bucketState describes the keys bucketize left in sc.ord.
type bucketState struct {
	cut   int    // the last bucket needed
	lo    uint32 // the smallest probability bits
	hi    uint32 // the largest: bucket of bits b is (hi−b)>>shift
	shift uint
}

// bucketize buckets cand's keys (sortKey) by probability, for sortPrefix
// and drawBucketed. It returns false when it sorted cand in place instead
// (at most sortSmall entries, or one probability). Otherwise sc.ord[:n]
// holds the keys grouped by bucket, buckets in descending order of
// probability, each stably in cand's order (unsorted); bucket d is
// sc.ord[start(d):sc.bcount[d]] (sc.bucket), sc.bmass[d] its mass summed
// in cand's order, and sc.bk.cut the first bucket where the count reaches
// k (k > 0) or else the cumulated bucket mass reaches mass (the last
// bucket when neither does).
//
// The keys, with the range of their probability bits, are built in one
// pass; a second counts them and sums their mass into ~n/4 buckets of
// equal width in bit space (about equal width in log-probability, a few
// keys each on a smooth row); a third scatters every key (no branch on
// the bucket: a branch measured slower, also where few are kept).
func (sc *Scratch) bucketize(cand []int32, probs []float32, k int, mass float64) bool {
	n := len(cand)
	if n < 2 {
		return false
	}
	if cap(sc.keys) < len(probs) {
		sc.keys = make([]uint64, len(probs))
		sc.ord = make([]uint64, len(probs))
	}
	keys := sc.keys[:n]
	lo, hi := ^uint32(0), uint32(0)
	for i, t := range cand {
		b := math.Float32bits(probs[t])
		keys[i] = sortKey(probs[t], t)
		lo = min(lo, b)
		hi = max(hi, b)
	}
	if n <= sortSmall || lo == hi {
		if lo == hi {
			// One probability: the candidates are ascending already
			// (draw's positions and presort's compaction keep id order),
			// but a caller's order is not assumed.
			if !slices.IsSorted(keys) {
				slices.Sort(keys)
			}
		} else {
			slices.Sort(keys)
		}
		for i, key := range keys {
			cand[i] = int32(uint32(key))
		}
		return false
	}
	// nb buckets (a power of two, ~n/4) over [lo, hi] in bit space: the
	// bucket of bits b is (hi−b)>>shift, ascending with the key.
	nb := 64
	for nb < n/4 && nb < maxBuckets {
		nb *= 2
	}
	shift := uint(0)
	for (hi-lo)>>shift >= uint32(nb) {
		shift++
	}
	nb = int((hi-lo)>>shift) + 1
	if sc.bcount == nil {
		sc.bcount = make([]int32, maxBuckets+1)
		sc.bmass = make([]float64, maxBuckets)
	}
	count := sc.bcount[:nb+1]
	bmass := sc.bmass[:nb]
	clear(count)
	clear(bmass)
	for _, key := range keys {
		b := keyBits(key)
		d := (hi - b) >> shift
		count[d]++
		bmass[d] += float64(math.Float32frombits(b))
	}
	// The cut; count becomes the buckets' start offsets.
	cut := -1
	var cum float64
	var off int32
	for d := range nb {
		c := count[d]
		count[d] = off
		off += c
		cum += bmass[d]
		if cut < 0 && ((k > 0 && int(off) >= k) || (k <= 0 && cum >= mass)) {
			cut = d
		}
	}
	if cut < 0 {
		cut = nb - 1
	}
	ord := sc.ord[:n]
	for _, key := range keys {
		d := (hi - keyBits(key)) >> shift
		ord[count[d]] = key
		count[d]++
	}
	// count[d] is now the end of bucket d (the start of d+1).
	sc.bk = bucketState{cut: cut, lo: lo, hi: hi, shift: shift}
	return true
}

// bucket returns bucket d of the last bucketize.
func (sc *Scratch) bucket(d int) []uint64 {
	start := int32(0)
	if d > 0 {
		start = sc.bcount[d-1]
	}
	return sc.ord[start:sc.bcount[d]]
}

// sortBucket sorts one bucket's keys.
func sortBucket(b []uint64) {
	if len(b) > bucketSortMax {
		slices.Sort(b)
	} else {
		insertionSort(b)
	}
}

// keyBits is the probability bits of a sortKey, keyProb the probability.
func keyBits(key uint64) uint32 { return ^uint32(key >> 32) }

func keyProb(key uint64) float32 { return math.Float32frombits(keyBits(key)) }

// drawBucketed is draw's top-k or top-p step (one of them, no min-p)
// without sorting the kept set, when the arithmetic allows it; it returns
// the same position as sorting c (presort's candidates, n of them in
// all, total their ExpSum) and walking the kept prefix would, with the
// same use of the random stream, or ok = false before drawing when it
// cannot (the caller then sorts).
//
// Why no sort is needed: let 2^E ≤ every probability in the buckets up
// to the cut (bucketize with mass topP·total, no margin) and total <
// 2^(E+29). Every such float32 is a multiple of 2^(E−23), so every sum of
// them, in any order, is exact in float64 (a multiple of 2^(E−23) below
// 2^(E+29)): the bucket masses, the top-p cumulative sum in sorted order
// at each bucket's end, the kept total (cpu.SumAt) and every u − prefix of
// the walk (u = Float64()·kept total; while it is ≥ 0 it is a multiple of
// min(ulp(u), 2^(E−23)) no larger than u, and the first negative one keeps
// its sign). So the cut bucket is the one the sorted walk would cut in,
// the walk's token is in the first bucket whose cumulated mass exceeds u,
// and only those two buckets need sorting.
func (s *Sampler) drawBucketed(sc *Scratch, c []int32, probs []float32, total float64, n int, useK bool, topK int, topP float64) (int32, bool) {
	k, mass := 0, math.Inf(1)
	if useK {
		k = topK
	} else {
		mass = topP * total
	}
	if !sc.bucketize(c, probs, k, mass) {
		return 0, false
	}
	bk := sc.bk
	cut := bk.cut
	// The smallest probability bits in buckets ≤ cut.
	low := uint64(bk.lo)
	if w := uint64(cut+1) << bk.shift; uint64(bk.hi)+1 > w {
		low = max(low, uint64(bk.hi)+1-w)
	}
	if low < 1<<23 { // zero or subnormal
		return 0, false
	}
	E := int(low>>23) - 127
	if !(total*(1+1e-6) < math.Ldexp(1, E+29)) {
		return 0, false
	}
	if testHookBucketed != nil {
		testHookBucketed()
	}
	bmass := sc.bmass
	var before float64 // exact mass of the buckets < cut
	for d := range cut {
		before += bmass[d]
	}
	cb := sc.bucket(cut)
	sortBucket(cb)
	// keep is the kept part of the cut bucket, kept their exact total.
	keep := cb
	cum := before
	if useK {
		keep = cb[:k-int(sc.bcount[cut])+len(cb)]
		for _, key := range keep {
			cum += float64(keyProb(key))
		}
	} else {
		for i, key := range cb {
			cum += float64(keyProb(key))
			if cum >= mass {
				keep = cb[:i+1]
				break
			}
		}
	}
	kept := cum
	if int(sc.bcount[cut])-len(cb)+len(keep) == n {
		kept = total // every candidate kept: draw uses ExpSum's total
	}
	u := s.rng.Float64() * kept
	var acc float64
	for d := range cut {
		if acc+bmass[d] > u {
			b := sc.bucket(d)
			sortBucket(b)
			return walkKeys(b, u-acc), true // the bucket's exact mass exceeds u−acc
		}
		acc += bmass[d]
	}
	return walkKeys(keep, u-acc), true
}

// walkKeys returns the id of the first of the sorted keys whose running
// probability sum exceeds u (the last one if rounding leaves u ≥ their
// total).
func walkKeys(keys []uint64, u float64) int32 {
	for _, key := range keys {
		u -= float64(keyProb(key))
		if u < 0 {
			return int32(uint32(key))
		}
	}
	return int32(uint32(keys[len(keys)-1]))
}

// testHookBucketed, when set (tests), is called on every draw that
// drawBucketed completes.
var testHookBucketed func()

// maxBuckets is the most buckets sortPrefix uses.
const maxBuckets = 2048

// insertionSort sorts a few keys (already almost in order after a stable
// scatter of ascending ids).
func insertionSort(b []uint64) {
	for i := 1; i < len(b); i++ {
		x := b[i]
		j := i
		for ; j > 0 && b[j-1] > x; j-- {
			b[j] = b[j-1]
		}
		b[j] = x
	}
}
