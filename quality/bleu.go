package quality

import (
	"bufio"
	"math"
	"os"
	"strings"
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
	match := make([]float64, maxN+1)
	total := make([]float64, maxN+1)
	var c, r float64
	for i := range hyps {
		h, ref := []rune(hyps[i]), []rune(refs[i])
		c += float64(len(h))
		r += float64(len(ref))
		for n := 1; n <= maxN; n++ {
			counts := map[string]int{}
			for j := 0; j+n <= len(ref); j++ {
				counts[string(ref[j:j+n])]++
			}
			for j := 0; j+n <= len(h); j++ {
				total[n]++
				if k := string(h[j : j+n]); counts[k] > 0 {
					counts[k]--
					match[n]++
				}
			}
		}
	}
	logSum := 0.0
	for n := 1; n <= maxN; n++ {
		if match[n] == 0 || total[n] == 0 {
			return 0
		}
		logSum += math.Log(match[n]/total[n]) / float64(maxN)
	}
	bp := 1.0
	if c < r && c > 0 {
		bp = math.Exp(1 - r/c)
	}
	return bp * math.Exp(logSum)
}
