package cpu

import "math"

// Kernels of the sampler's per-vocabulary loops (package sampler runs them
// on every logits row it samples: ~6k floats, dozens of rows per couplet).
// Like the other elementwise kernels they come from elem: plain Go, or
// AVX2/FMA assembly on amd64 (sample_amd64.s) unless SetGEMMPath("go").

// ScanMax returns the largest entry of x, the first index holding it and
// whether x has NaNs (which it skips); m is -Inf and im 0 when no entry is
// above -Inf (x empty, all -Inf or NaN).
func ScanMax(x []float32) (m float32, im int, hasNaN bool) { return elem.scanMax(x) }

// ExpSum sets dst[i] = exp(fl(src[i]·scale) − shift) for i < len(src) and
// returns Σ dst[i] in float64. The product is rounded to float32 before the
// subtraction (no FMA), so with shift = fl(max·scale) the max entry gives
// exactly 1 and every other entry at most 1 (scale > 0): dst is then
// softmax(src·scale) times Σ, the unnormalised softmax. Arguments below
// expMin (≈ −87.3, −Inf included; from ≈ −86.99 in the assembly, where
// e^x < 2.4e-38) give 0, above ≈ 88.7 +Inf, NaN gives NaN. exp is expf's
// polynomial (relative error ~1e-7). dst may alias src
// and must be at least as long. The summation order and precision (the
// assembly adds pairs in float32 first: relative error ≤ 6e-8) depend on
// the implementation, never on the call: equal inputs give equal sums.
func ExpSum(dst, src []float32, scale, shift float32) float64 {
	return elem.expSum(dst[:len(src)], src, scale, shift)
}

// Exp is ExpSum without the sum (the same entries, a quarter cheaper).
func Exp(dst, src []float32, scale, shift float32) { elem.exp(dst[:len(src)], src, scale, shift) }

// CompactGreater writes the indices i with x[i] > thr, ascending, to
// idx[:n] and returns n and Σ x[i] over them (float64; the assembly adds
// pairs in float32 first, relative error ≤ 6e-8). idx must be at
// least len(x) long: the vector kernel stores whole blocks, so idx[n:]
// holds garbage afterwards.
func CompactGreater(idx []int32, x []float32, thr float32) (n int, sum float64) {
	return elem.compact(idx[:len(x)], x, thr)
}

// SumAt returns Σ x[i] over the indices idx in float64, in four
// interleaved partial sums (one running sum would be a chain of dependent
// adds): ((s0 + s1) + (s2 + s3)), s_r over idx[4k+r], the tail into s0.
func SumAt(x []float32, idx []int32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(idx); i += 4 {
		s0 += float64(x[idx[i]])
		s1 += float64(x[idx[i+1]])
		s2 += float64(x[idx[i+2]])
		s3 += float64(x[idx[i+3]])
	}
	for ; i < len(idx); i++ {
		s0 += float64(x[idx[i]])
	}
	return (s0 + s1) + (s2 + s3)
}

// CompactGreaterVals writes the indices i with x[i] > thr, ascending, to
// idx[:n] and the x[i] themselves to vals[:n], and returns n. idx and vals
// must be at least len(x) long (garbage after n, as CompactGreater).
func CompactGreaterVals(idx []int32, vals, x []float32, thr float32) int {
	return elem.compactVals(idx[:len(x)], vals[:len(x)], x, thr)
}

func scanMaxGo(x []float32) (m float32, im int, hasNaN bool) {
	m = float32(math.Inf(-1))
	for i, v := range x {
		if v > m {
			m, im = v, i
		} else if v != v {
			hasNaN = true
		}
	}
	return m, im, hasNaN
}

func expSumGo(dst, src []float32, scale, shift float32) float64 {
	dst = dst[:len(src)]
	var sum float64
	for i, v := range src {
		e := expf(float32(v*scale) - shift)
		dst[i] = e
		sum += float64(e)
	}
	return sum
}

// compactValsGo is compactGo's branch-free loop, storing the value too.
func compactValsGo(idx []int32, vals, x []float32, thr float32) int {
	idx, vals = idx[:len(x)], vals[:len(x)]
	n := 0
	for i, v := range x {
		idx[n] = int32(i)
		vals[n] = v
		k := 0
		if v > thr {
			k = 1
		}
		n += k
	}
	return n
}

func expGo(dst, src []float32, scale, shift float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = expf(float32(v*scale) - shift)
	}
}

// compactGo is branch-free: every index is written, the count only moves
// past the kept ones (they are scattered over a vocabulary, so a branch
// per entry would mispredict often). The sum is then SumAt over the kept
// entries.
func compactGo(idx []int32, x []float32, thr float32) (int, float64) {
	idx = idx[:len(x)]
	n := 0
	for i, v := range x {
		idx[n] = int32(i)
		k := 0
		if v > thr {
			k = 1
		}
		n += k
	}
	return n, SumAt(x, idx[:n])
}
