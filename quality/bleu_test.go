package quality

import (
	"math"
	"testing"
)

func TestBLEU(t *testing.T) {
	for _, c := range []struct {
		hyps, refs []string
		n          int
		want       float64
	}{
		{[]string{"ab"}, []string{"ab"}, 2, 1},
		{[]string{"ac"}, []string{"ab"}, 2, 0},                      // no bigram match, no smoothing
		{[]string{"abc"}, []string{"abcd"}, 2, math.Exp(1 - 4.0/3)}, // brevity penalty only
		{[]string{"aa"}, []string{"ab"}, 1, 0.5},                    // clipped counts
		{[]string{"ab", "cd"}, []string{"ab", "ce"}, 1, 0.75},       // corpus-level sums
	} {
		if got := BLEU(c.hyps, c.refs, c.n); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("BLEU(%v, %v, %d) = %v, want %v", c.hyps, c.refs, c.n, got, c.want)
		}
	}
}
