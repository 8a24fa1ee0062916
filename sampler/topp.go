package sampler

// The cut of draw's candidates to those top-k, top-p and min-p keep, in
// probability order: a full sort is too slow over a vocabulary-sized row,
// so the few likely tokens are found by thresholds and buckets first.

import (
	"math"
	"slices"

	"chunlian/kernels/cpu"
)

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
	u := s.float64() * kept
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
