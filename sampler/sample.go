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
	rng rand.PCG // by value: one allocation per sample instead of three
	own *Scratch // Sample's and SampleLSE's buffers, made on first use
}

// float64 is math/rand/v2's Rand.Float64 on s.rng, bit for bit: a seed
// draws the same stream as it did through a *rand.Rand.
func (s *Sampler) float64() float64 { return float64(s.rng.Uint64()<<11>>11) / (1 << 53) }

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
	sp := new(Sampler)
	sp.Init(p, index)
	return sp
}

// Init makes s what New(p, index) returns, in place: for a caller that
// keeps its Sampler inside a larger struct (the engine's sequences) and so
// saves an allocation.
func (s *Sampler) Init(p Params, index int) {
	seed := p.Seed
	if seed == 0 {
		seed = rand.Uint64() | 1
	}
	*s = Sampler{p: p}
	s.rng.Seed(seed, uint64(index))
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
		return cand[pick(probs, s.float64()*total)]
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
	u := s.float64() * total
	for _, j := range sel {
		u -= float64(probs[j])
		if u < 0 {
			return cand[j]
		}
	}
	return cand[sel[len(sel)-1]] // rounding left u ≥ 0 at the end
}

// expNeg returns e^x for x ≤ 0 (0 below -87, where float32 underflows),
// with relative error below 2e-7: x = n·ln2 + f with |f| ≤ ln2/2, e^f by a
// degree-7 Taylor polynomial, 2^n through the exponent bits. About five
// times cheaper than math.Exp, and softmax over a 6000-token vocabulary
// runs for every sample of every step.
func expNeg(x float32) float32 {
	if x < -87 {
		return 0
	}
	const log2e = 1.4426950408889634
	const ln2hi, ln2lo = 0.693145751953125, 1.428606765330187e-06
	// Round x·log2e to an integer n by truncating toward zero after a -0.5
	// shift (x ≤ 0): |f| stays ≤ ln2/2 up to rounding, and no float64 floor.
	n := float32(int32(x*log2e - 0.5))
	f := x - n*ln2hi - n*ln2lo
	p := 1 + f*(1+f*(1.0/2+f*(1.0/6+f*(1.0/24+f*(1.0/120+f*(1.0/720+f*(1.0/5040)))))))
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}
