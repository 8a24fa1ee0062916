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
// not safe for concurrent use: the engine goroutine owns every Sampler and
// calls it once per step of its sequence.
//
// Zero values of the optional parameters mean "off": TopK ≤ 0, TopP ≤ 0 or
// ≥ 1, MinP ≤ 0 and RepetitionPenalty ≤ 0 or == 1 all disable their stage, so
// a zero Params is plain greedy decoding.
type Sampler struct {
	p   Params
	rng *rand.Rand

	// Scratch buffers, all of vocab size V once the first row is seen; reused
	// every step so sampling makes no garbage in steady state.
	work  []float32 // [V] logits after processors, penalty and temperature
	probs []float32 // [V] softmax(work / T)
	lse   []float32 // [V] scratch of logSumExp
	cand  []int32   // [≤V] candidate token ids still allowed
	stamp []uint32  // [V] repetition-penalty dedup marks (== gen means seen)
	gen   uint32
	// Histogram of candidate probabilities for top-k/top-p (presort).
	bmass  []float64 // [numBuckets] probability mass per bucket
	bcount []int32   // [numBuckets] tokens per bucket
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

// logSumExp computes LogSumExp with scratch ([len(row)]) through the
// kernels' vectorised Softmax: softmax at the max element is 1/Σexp(x-m),
// so lse = m − log(softmax[argmax]). Rows with NaNs take a scalar loop.
func logSumExp(row, scratch []float32) float64 {
	m := float32(math.Inf(-1))
	im, hasNaN := 0, false
	for i, v := range row {
		if v > m {
			m, im = v, i
		} else if v != v {
			hasNaN = true
		}
	}
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
	copy(scratch, row)
	cpu.Softmax(scratch)
	return float64(m) - math.Log(float64(scratch[im]))
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
	return s.sample(row, math.NaN(), prompt, generated, proc)
}

// SampleLSE is Sample with lse = LogSumExp(row) already known (the engine
// computes it for all rows of a step in parallel, and once for the n
// samples that share a row).
func (s *Sampler) SampleLSE(row []float32, lse float64, prompt, generated []int32, proc LogitsProcessor) (int32, float32, error) {
	return s.sample(row, lse, prompt, generated, proc)
}

// sample implements Sample; lse is NaN when not known yet.
func (s *Sampler) sample(row []float32, lse float64, prompt, generated []int32, proc LogitsProcessor) (int32, float32, error) {
	V := len(row)
	if V == 0 {
		return 0, 0, fmt.Errorf("sampler: empty logits row")
	}
	if cap(s.work) < V {
		s.work = make([]float32, V)
		s.probs = make([]float32, V)
		s.cand = make([]int32, 0, V)
		s.stamp = make([]uint32, V)
		s.lse = make([]float32, V)
	}
	w := s.work[:V]
	copy(w, row)
	negInf := float32(math.Inf(-1))
	for i, v := range w {
		if v != v {
			w[i] = negInf
		}
	}
	if proc != nil {
		if err := proc.Process(generated, w); err != nil {
			return 0, 0, err
		}
	}
	alive := false
	for _, v := range w {
		if v > negInf { // false for -Inf and NaN
			alive = true
			break
		}
	}
	if !alive {
		return 0, 0, ErrDeadEnd
	}
	if rp := s.p.RepetitionPenalty; rp > 0 && rp != 1 {
		s.gen++
		if s.gen == 0 { // wrapped: old marks could collide
			clear(s.stamp)
			s.gen = 1
		}
		s.penalize(w, prompt, rp)
		s.penalize(w, generated, rp)
	}
	var tok int32
	if s.p.Temperature == 0 {
		tok = argmax(w)
	} else {
		tok = s.draw(w)
	}
	if lse != lse {
		lse = logSumExp(row, s.lse[:V])
	}
	return tok, float32(float64(row[tok]) - lse), nil
}

// penalize applies the HF repetition penalty (positive logits divided,
// negative multiplied) once per distinct token: stamp[t] == gen marks tokens
// already penalised in this Sample call, across prompt and generated.
func (s *Sampler) penalize(w []float32, toks []int32, rp float32) {
	for _, t := range toks {
		if t < 0 || int(t) >= len(w) || s.stamp[t] == s.gen {
			continue
		}
		s.stamp[t] = s.gen
		if w[t] > 0 {
			w[t] /= rp
		} else {
			w[t] *= rp
		}
	}
}

func argmax(w []float32) int32 {
	best := 0
	for i, v := range w {
		if v > w[best] {
			best = i
		}
	}
	return int32(best)
}

// numBuckets covers the bucket keys of probabilities in (0, 1]: the float32
// bits shifted right by 20 (exponent and top 3 mantissa bits); 1.0 → 1016.
const numBuckets = 0x3F8 + 1

func bucketOf(p float32) int { return int(math.Float32bits(p) >> 20) }

// draw samples from softmax(w/T) restricted by top-k, top-p and min-p.
func (s *Sampler) draw(w []float32) int32 {
	// probs = softmax(w/T) (w holds no NaN; -Inf entries get 0). Tokens
	// below e^negligible of the most likely one are never drawn.
	invT := 1 / s.p.Temperature
	probs := s.probs[:len(w)]
	im := 0
	for i, v := range w {
		probs[i] = v * invT
		if v > w[im] {
			im = i
		}
	}
	cpu.Softmax(probs)
	pmax := probs[im]
	thr := pmax * float32(math.Exp(negligible))
	cand := s.cand[:0]
	var total float64
	for i, p := range probs {
		if p > thr {
			cand = append(cand, int32(i))
			total += float64(p)
		}
	}
	topK := s.p.TopK
	topP := float64(s.p.TopP)
	useK := topK > 0 && topK < len(cand)
	useP := topP > 0 && topP < 1
	if useK || useP {
		cand = s.presort(cand, probs, total, useK, topK, topP)
		if useK && topK < len(cand) {
			cand = cand[:topK]
		}
		if useP {
			// The nucleus is taken over the mass left after top-k: all of
			// it without top-k (presort may have dropped small tokens).
			kept := total
			if useK {
				kept = 0
				for _, t := range cand {
					kept += float64(probs[t])
				}
			}
			var cum float64
			for i, t := range cand {
				cum += float64(probs[t])
				if cum >= topP*kept {
					cand = cand[:i+1]
					break
				}
			}
		}
	}
	if mp := s.p.MinP; mp > 0 {
		k := cand[:0]
		thr := mp * pmax
		for _, t := range cand {
			if probs[t] >= thr {
				k = append(k, t)
			}
		}
		cand = k
	}
	total = 0
	for _, t := range cand {
		total += float64(probs[t])
	}
	u := s.rng.Float64() * total
	for _, t := range cand {
		u -= float64(probs[t])
		if u < 0 {
			return t
		}
	}
	return cand[len(cand)-1] // rounding left u ≥ 0 at the end
}

// presort returns the candidates that can be in the top k (useK) or else in
// the top-p nucleus, sorted by probability (descending, ties by id). Sorting
// the whole vocabulary every step would dominate sampling, so it first
// histograms the probabilities into log-spaced buckets and keeps only the
// buckets down to the one where the count reaches k or the mass reaches
// topP·total (plus one more bucket against rounding). Every dropped token
// is smaller than every kept one, so the sorted prefix is unchanged.
func (s *Sampler) presort(cand []int32, probs []float32, total float64, useK bool, topK int, topP float64) []int32 {
	if s.bmass == nil {
		s.bmass = make([]float64, numBuckets)
		s.bcount = make([]int32, numBuckets)
	}
	clear(s.bmass)
	clear(s.bcount)
	for _, t := range cand {
		b := bucketOf(probs[t])
		s.bmass[b] += float64(probs[t])
		s.bcount[b]++
	}
	cut, extra := 0, 1
	var mass float64
	var count int
	for b := numBuckets - 1; b >= 0; b-- {
		if s.bcount[b] == 0 {
			continue
		}
		mass += s.bmass[b]
		count += int(s.bcount[b])
		cut = b
		if (useK && count >= topK) || (!useK && mass >= topP*total) {
			if extra == 0 {
				break
			}
			extra--
		}
	}
	k := cand[:0]
	for _, t := range cand {
		if bucketOf(probs[t]) >= cut {
			k = append(k, t)
		}
	}
	slices.SortFunc(k, func(a, b int32) int {
		if probs[a] != probs[b] {
			if probs[a] > probs[b] {
				return -1
			}
			return 1
		}
		return int(a - b)
	})
	return k
}
