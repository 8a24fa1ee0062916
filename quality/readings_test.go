package quality

import (
	"bufio"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"chunlian/couplet"
	"chunlian/critic"
)

// reading is one couplet of a recorded blind reading with its verdicts.
type reading struct {
	word, upper, lower string
	logProb            float64
	verdicts           []string // h, a or o, one per reader
}

// readReadings parses testdata/readings/tuning.tsv: a header line, then
// word, upper, lower, logprob, reverse, reader1, reader2 ('#' comments).
func readReadings(t *testing.T, path string) []reading {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []reading
	sc := bufio.NewScanner(f)
	header := true
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if header {
			header = false
			continue
		}
		c := strings.Split(line, "\t")
		if len(c) != 7 {
			t.Fatalf("%s: %d columns in %q", path, len(c), line)
		}
		lp, err := strconv.ParseFloat(c[3], 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, reading{word: c[0], upper: c[1], lower: c[2], logProb: lp, verdicts: c[5:7]})
	}
	return out
}

// oddShare is the share of readers' verdicts that are "o".
func (r reading) oddShare() float64 {
	n := 0
	for _, v := range r.verdicts {
		if v == "o" {
			n++
		}
	}
	return float64(n) / float64(len(r.verdicts))
}

// TestDefaultWeightsTrackReaders: on the recorded tuning reading, the
// couplet the shipped weights rank first among k random candidates of a
// word is odd less often than the one the model's log-prob alone ranks
// first, and far less often than a random candidate (the candidate
// count the service draws, k = couplet.DefaultSamples). The weights were
// fitted on this reading, so this guards them against regressions; the
// held-out figure is in docs/DECISIONS.md.
func TestDefaultWeightsTrackReaders(t *testing.T) {
	rows := readReadings(t, "testdata/readings/tuning.tsv")
	byWord := map[string][]reading{}
	var words []string
	for _, r := range rows {
		if byWord[r.word] == nil {
			words = append(words, r.word)
		}
		byWord[r.word] = append(byWord[r.word], r)
	}
	if len(words) != 20 || len(rows) != 320 {
		t.Fatalf("%d words, %d rows: the recorded reading changed", len(words), len(rows))
	}
	judge := critic.Judge{}
	score := func(r reading, w couplet.Weights) float64 {
		return w.Score(couplet.TextFeatures(r.upper, r.lower, r.logProb, judge))
	}
	lpOnly := couplet.Weights{LogProb: 1}
	k := couplet.DefaultSamples
	rng := rand.New(rand.NewPCG(1, 2))
	var odd, oddLP, oddRandom float64
	n := 0
	for _, w := range words {
		cands := byWord[w]
		for trial := 0; trial < 200; trial++ {
			perm := rng.Perm(len(cands))[:k]
			best, bestLP := cands[perm[0]], cands[perm[0]]
			for _, i := range perm[1:] {
				if c := cands[i]; score(c, couplet.DefaultWeights) > score(best, couplet.DefaultWeights) {
					best = c
				}
				if c := cands[i]; score(c, lpOnly) > score(bestLP, lpOnly) {
					bestLP = c
				}
			}
			odd += best.oddShare()
			oddLP += bestLP.oddShare()
			oddRandom += cands[perm[0]].oddShare()
			n++
		}
	}
	odd, oddLP, oddRandom = odd/float64(n), oddLP/float64(n), oddRandom/float64(n)
	t.Logf("odd share of the top-ranked of %d: default weights %.3f, log-prob alone %.3f, a random candidate %.3f", k, odd, oddLP, oddRandom)
	if odd > oddLP {
		t.Errorf("the default weights pick odd couplets more often (%.3f) than log-prob alone (%.3f)", odd, oddLP)
	}
	if odd > 0.6*oddRandom {
		t.Errorf("the default weights' pick is odd %.3f of the time, a random candidate %.3f: ranking barely helps", odd, oddRandom)
	}
}
