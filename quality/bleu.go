package quality

import (
	"bufio"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"

	"chunlian/stats"
)

// ReadPairs returns up to limit (上联, 下联) pairs of an upper<TAB>lower
// file, in file order.
func ReadPairs(path string, limit int) (uppers, lowers []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() && len(uppers) < limit {
		u, l, ok := strings.Cut(sc.Text(), "\t")
		if ok && u != "" {
			uppers = append(uppers, u)
			lowers = append(lowers, l)
		}
	}
	return uppers, lowers, sc.Err()
}

// BLEU is corpus BLEU over characters (as in docs/EVAL.md's Python side):
// clipped n-gram precisions p_1..p_maxN summed over the corpus, uniform
// weights, no smoothing, brevity penalty exp(1 − r/c) when c < r.
func BLEU(hyps, refs []string, maxN int) float64 {
	return corpusStats(hyps, refs, maxN).sumOf(nil).bleu()
}

// BLEUInterval is the percentile bootstrap interval of BLEU at the given
// level (0.95: the 2.5th and 97.5th percentiles) over resamples of the
// pairs: each resample draws len(hyps) pairs with replacement and
// computes corpus BLEU on them. It is the spread that comes from which
// pairs the test set happens to hold, so two models whose figures differ
// by much less than its width are not told apart by this test set.
// Deterministic for a seed.
func BLEUInterval(hyps, refs []string, maxN, resamples int, level float64, seed uint64) (lo, hi float64) {
	st := corpusStats(hyps, refs, maxN)
	if len(hyps) == 0 || resamples < 1 {
		b := st.sumOf(nil).bleu()
		return b, b
	}
	vals := bootstrap(len(hyps), resamples, seed, func(idx []int) float64 { return st.sumOf(idx).bleu() })
	return percentiles(vals, level)
}

// BLEUDiff compares two systems' hypotheses for the same references by
// the paired bootstrap: each resample draws the same len(refs) pairs with
// replacement for both, and the result is the percentile interval of
// BLEU(b) − BLEU(a) at the given level and the share of resamples in which
// b scored higher. Pairing removes the spread both systems share (which
// pairs are easy), so it separates much closer systems than comparing
// two BLEUInterval results. Deterministic for a seed.
func BLEUDiff(a, b, refs []string, maxN, resamples int, level float64, seed uint64) (lo, hi, bHigher float64) {
	sa, sb := corpusStats(a, refs, maxN), corpusStats(b, refs, maxN)
	if len(refs) == 0 || resamples < 1 {
		d := sb.sumOf(nil).bleu() - sa.sumOf(nil).bleu()
		return d, d, 0
	}
	vals := bootstrap(len(refs), resamples, seed, func(idx []int) float64 { return sb.sumOf(idx).bleu() - sa.sumOf(idx).bleu() })
	higher := 0
	for _, v := range vals {
		if v > 0 {
			higher++
		}
	}
	lo, hi = percentiles(vals, level)
	return lo, hi, float64(higher) / float64(resamples)
}

// bootstrap returns stat of resamples resamples of n pairs, each drawn
// with replacement (stat gets the drawn indices, in a buffer it must not
// keep). Deterministic for a seed.
func bootstrap(n, resamples int, seed uint64, stat func(idx []int) float64) []float64 {
	r := rand.New(rand.NewPCG(seed, 0x626c6575))
	idx := make([]int, n)
	vals := make([]float64, resamples)
	for k := range vals {
		for i := range idx {
			idx[i] = r.IntN(n)
		}
		vals[k] = stat(idx)
	}
	return vals
}

// percentiles sorts vals and returns its (1−level)/2 and 1−(1−level)/2
// percentiles (nearest rank, stats.Percentile).
func percentiles(vals []float64, level float64) (lo, hi float64) {
	slices.Sort(vals)
	return stats.Percentile(vals, 100*(1-level)/2), stats.Percentile(vals, 100*(1-(1-level)/2))
}

// bleuStats are the sums corpus BLEU is computed from: clipped n-gram
// matches and n-gram counts of the hypotheses for n = 1..maxN (index n),
// and hypothesis and reference lengths.
type bleuStats struct {
	match, total []float64
	c, r         float64
}

// pairStats holds one bleuStats per pair, so that resamples only add.
type pairStats []bleuStats

func corpusStats(hyps, refs []string, maxN int) pairStats {
	st := make(pairStats, len(hyps))
	for i := range hyps {
		h, ref := []rune(hyps[i]), []rune(refs[i])
		s := bleuStats{match: make([]float64, maxN+1), total: make([]float64, maxN+1), c: float64(len(h)), r: float64(len(ref))}
		for n := 1; n <= maxN; n++ {
			counts := map[string]int{}
			for j := 0; j+n <= len(ref); j++ {
				counts[string(ref[j:j+n])]++
			}
			for j := 0; j+n <= len(h); j++ {
				s.total[n]++
				if k := string(h[j : j+n]); counts[k] > 0 {
					counts[k]--
					s.match[n]++
				}
			}
		}
		st[i] = s
	}
	return st
}

// sumOf adds the pairs at idx (nil: every pair once). With no pairs the
// sum has maxN 0 and its bleu is 0.
func (st pairStats) sumOf(idx []int) bleuStats {
	if len(st) == 0 {
		return bleuStats{}
	}
	maxN := len(st[0].match) - 1
	sum := bleuStats{match: make([]float64, maxN+1), total: make([]float64, maxN+1)}
	add := func(s *bleuStats) {
		for n := 1; n <= maxN; n++ {
			sum.match[n] += s.match[n]
			sum.total[n] += s.total[n]
		}
		sum.c += s.c
		sum.r += s.r
	}
	if idx == nil {
		for i := range st {
			add(&st[i])
		}
	} else {
		for _, i := range idx {
			add(&st[i])
		}
	}
	return sum
}

func (s bleuStats) bleu() float64 {
	maxN := len(s.match) - 1
	if maxN < 1 {
		return 0
	}
	logSum := 0.0
	for n := 1; n <= maxN; n++ {
		if s.match[n] == 0 || s.total[n] == 0 {
			return 0
		}
		logSum += math.Log(s.match[n]/s.total[n]) / float64(maxN)
	}
	bp := 1.0
	if s.c < s.r && s.c > 0 {
		bp = math.Exp(1 - s.r/s.c)
	}
	return bp * math.Exp(logSum)
}
