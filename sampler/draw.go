package sampler

import "math"

// DrawParams are the sampling parameters of one DrawRow call (as in
// Params; 0/≤0 = off, TopP ≥ 1 = off).
type DrawParams struct {
	Temperature, TopP, MinP float32
	TopK                    int32
}

// drawRounds is the number of rejection rounds of DrawRow (step 6).
const drawRounds = 64

// DrawRow is the device draw's definition (see forward.Draw): the token a
// backend that draws where the logits are returns for the raw logits row,
// the allowed set (nil = every token; else bit t%64 of allowed[t/64]
// allows t, tokens ≥ 64·len(allowed) are not allowed), the further
// forbidden ids exclude (ids outside the row ignored), p and the uniform u
// in [0, 1); -1 when nothing is allowed (dead end). The GPU kernel and the
// CPU test backend are checked against it, arithmetic included:
//
//  1. Mask: w_i = row_i, or -Inf where i is not allowed, excluded or NaN.
//  2. m = max w, im the lowest id holding it. -1 if !(m > -Inf); im if T == 0.
//  3. invT = float32(1)/T; thr = m + float32(−24·T) (float32; if !(thr < m),
//     thr = nextafter32(m, -Inf)); p_i = float32(exp(float64((w_i−m)·invT)))
//     (product in float32) for w_i > thr, else 0; Z = Σ p_i in float64.
//     im if !(Z ≥ 1) (+Inf max, overflowing 1/T). p_im = 1.
//  4. Nucleus: j (p_j > 0) is in it iff (TopP off or above_j < float64(TopP)·Z)
//     and (TopK ≤ 0 or rank_j < TopK), where above_j = Σ p_i (float64) and
//     rank_j = the count over the i before j in sorted order (p_i > p_j, or
//     p_i == p_j and i < j): sampler's sorted prefix (probability
//     descending, ties by lower id) up to the item whose cumulative mass
//     reaches TopP·Z, at most TopK items.
//  5. S_0 = { i : p_i > 0 and (MinP ≤ 0 or p_i ≥ MinP) } (min-p relative
//     to p_im = 1).
//  6. Rounds r = 0…63: j = the first i of S_r in ascending id order whose
//     running float64 sum of p exceeds DrawUniform(u, r)·Σ_{S_r} p (the
//     largest id of S_r if none does: rounding). Return j if it is in the
//     nucleus; else S_{r+1} = the i of S_r before j in sorted order (j and
//     every token after it are outside the nucleus, a sorted prefix).
//     After 64 rounds (never in practice) return im; im also when S_0 is
//     empty (MinP > 1 or NaN, outside Validate's range).
//
// Why no sort, and rounds: sorting V logits per row is what a GPU block
// does worst, while a draw ∝ p in id order is one prefix sum and the
// nucleus test of one token one reduction. Each round draws ∝ p from S_r,
// which always holds the kept set (nucleus ∩ min-p, im included) and only
// loses tokens outside it, so the accepted token is distributed ∝ p over
// the kept set: Sampler's distribution (but with both TopK and TopP,
// Sampler takes top-p over the top-k mass, this over Z), though the same
// u gives another token. A round accepts with a probability of at least
// the kept set's share of S_r's mass, so a few rounds suffice.
//
// DrawRow allocates one []float32 of len(row) and makes three O(V) passes
// per round; it is a reference (and the CPU test backend's draw), not fast.
func DrawRow(row []float32, allowed []uint64, exclude []int32, p DrawParams, u float64) int32 {
	negInf := float32(math.Inf(-1))
	w := maskedRow(row, allowed, exclude) // step 1, in the scratch that later holds p
	// Step 2.
	m, im := negInf, -1
	for i, v := range w {
		if v > m {
			m, im = v, i
		}
	}
	if !(m > negInf) {
		return -1
	}
	T := p.Temperature
	if T == 0 {
		return int32(im)
	}
	// Step 3. The explicit float32 conversions keep Go from fusing
	// m + (−24)·T into one FMA (the definition rounds the product).
	invT := float32(1) / T
	thr := m + float32(float32(negligible)*T)
	if !(thr < m) {
		thr = math.Nextafter32(m, negInf)
	}
	pr := w // p overwrites w in place
	var Z float64
	for i, v := range w {
		var q float32
		if v > thr {
			q = float32(math.Exp(float64(float32((v - m) * invT))))
		}
		pr[i] = q
		Z += float64(q)
	}
	if !(Z >= 1) {
		return int32(im)
	}
	// Step 4's parameters.
	useP := 0 < p.TopP && p.TopP < 1
	useK := p.TopK > 0
	pmass := float64(p.TopP) * Z
	// Step 5: S_0 = { p_i > 0 && (MinP <= 0 || p_i >= MinP) }.
	minP := p.MinP
	useMin := minP > 0
	// Step 6. S_r = S_0 ∩ { i : p_i > pb || (p_i == pb && i < b) } for the
	// last rejected token b (no bound in round 0: b = -1).
	b, pb := -1, float32(0)
	in := func(i int, q float32) bool {
		if !(q > 0) || (useMin && !(q >= minP)) {
			return false
		}
		return b < 0 || q > pb || (q == pb && i < b)
	}
	for r := range drawRounds {
		var Zr float64
		last := -1
		for i, q := range pr {
			if in(i, q) {
				Zr += float64(q)
				last = i
			}
		}
		if last < 0 {
			// S_0 empty: only where MinP > 1 or NaN (outside Validate's
			// range), which drops im too; the max token, as after 64 rounds.
			return int32(im)
		}
		target := DrawUniform(u, r) * Zr
		j := last // none exceeds target (rounding): the largest id of S_r
		var run float64
		for i, q := range pr {
			if in(i, q) {
				run += float64(q)
				if run > target {
					j = i
					break
				}
			}
		}
		if !useP && !useK {
			return int32(j)
		}
		if inNucleus(pr, j, useP, useK, pmass, p.TopK) {
			return int32(j)
		}
		b, pb = j, pr[j]
	}
	return int32(im)
}

// maskedRow is DrawRow's step 1: a copy of row with NaN, the entries
// outside allowed (nil: none) and those in exclude set to -Inf.
func maskedRow(row []float32, allowed []uint64, exclude []int32) []float32 {
	negInf := float32(math.Inf(-1))
	w := make([]float32, len(row))
	for i, v := range row {
		if v != v || (allowed != nil && (i>>6 >= len(allowed) || allowed[i>>6]&(1<<(uint(i)&63)) == 0)) {
			v = negInf
		}
		w[i] = v
	}
	for _, t := range exclude {
		if t >= 0 && int(t) < len(row) {
			w[t] = negInf
		}
	}
	return w
}

// inNucleus reports whether token j (p[j] > 0) is in the nucleus of step
// 4: above_j = Σ p_i (float64, ascending id) over the tokens before j in
// sorted order (p_i > p_j, or p_i == p_j and i < j), rank_j their count;
// j is in iff (!useP || above_j < pmass) && (!useK || rank_j < topK). Both
// only grow along the pass, so it stops as soon as either fails.
func inNucleus(p []float32, j int, useP, useK bool, pmass float64, topK int32) bool {
	pj := p[j]
	var above float64
	var rank int32
	for i, q := range p {
		if q > pj || (q == pj && i < j) {
			above += float64(q)
			rank++
			if (useP && !(above < pmass)) || (useK && rank >= topK) {
				return false
			}
		}
	}
	return true
}

// DrawUniform is the round-r uniform of step 6 (u itself for r == 0):
// the top 53 bits of splitmix64(bits(u) + r·0x9E3779B97F4A7C15), in [0, 1).
func DrawUniform(u float64, r int) float64 {
	if r == 0 {
		return u
	}
	z := math.Float64bits(u) + uint64(r)*0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return float64(z>>11) * 0x1p-53
}
