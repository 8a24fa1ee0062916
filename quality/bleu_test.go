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

func TestBLEUInterval(t *testing.T) {
	// A corpus where about a third of the pairs match their reference and
	// the rest share only unigrams: BLEU-2 well inside (0, 1).
	var hyps, refs []string
	for i := 0; i < 300; i++ {
		r := string(rune('一'+i%50)) + string(rune('二'+i%7)) + string(rune('三'+i%11)) + string(rune('四'+i%13))
		h := r
		if i%3 != 0 {
			h = r[:3] + string(rune('五'+i%17)) + string(rune('六'+i%19)) + string(rune('七'+i%23))
		}
		hyps, refs = append(hyps, h), append(refs, r)
	}
	point := BLEU(hyps, refs, 2)
	if point <= 0.1 || point >= 0.9 {
		t.Fatalf("fixture BLEU-2 %v not inside (0.1, 0.9)", point)
	}
	lo, hi := BLEUInterval(hyps, refs, 2, 400, 0.95, 7)
	if !(lo < point && point < hi) {
		t.Errorf("95%% interval [%v, %v] does not hold the point estimate %v", lo, hi, point)
	}
	if lo2, hi2 := BLEUInterval(hyps, refs, 2, 400, 0.95, 7); lo2 != lo || hi2 != hi {
		t.Errorf("same seed gave [%v, %v], then [%v, %v]", lo, hi, lo2, hi2)
	}
	// Four copies of the corpus: same point estimate, about half the width.
	var h4, r4 []string
	for k := 0; k < 4; k++ {
		h4, r4 = append(h4, hyps...), append(r4, refs...)
	}
	if p4 := BLEU(h4, r4, 2); math.Abs(p4-point) > 1e-12 {
		t.Errorf("BLEU of the repeated corpus %v, want %v", p4, point)
	}
	lo4, hi4 := BLEUInterval(h4, r4, 2, 400, 0.95, 7)
	if w, w4 := hi-lo, hi4-lo4; !(w4 > 0.3*w && w4 < 0.7*w) {
		t.Errorf("interval width %v for 4× the pairs, want about half of %v", w4, w)
	}
	// A perfect corpus has no spread; a narrower level gives a narrower interval.
	if plo, phi := BLEUInterval(refs, refs, 4, 100, 0.95, 1); plo != 1 || phi != 1 {
		t.Errorf("perfect corpus interval [%v, %v], want [1, 1]", plo, phi)
	}
	if l50, h50 := BLEUInterval(hyps, refs, 2, 400, 0.5, 7); !(l50 >= lo && h50 <= hi && h50-l50 < hi-lo) {
		t.Errorf("50%% interval [%v, %v] not inside the 95%% one [%v, %v]", l50, h50, lo, hi)
	}
}

func TestBLEUDiff(t *testing.T) {
	var refs, a, b, c []string
	for i := 0; i < 200; i++ {
		r := string(rune('一'+i%50)) + string(rune('二'+i%7)) + string(rune('三'+i%11)) + string(rune('四'+i%13))
		wrong := string(rune('五' + i%17))
		refs = append(refs, r)
		// a gets the last character wrong in every pair; b only in odd
		// pairs, so b is at least as good on every pair.
		a = append(a, r[:9]+wrong)
		if i%2 == 0 {
			b = append(b, r)
		} else {
			b = append(b, r[:9]+wrong)
		}
		// c is a with the pairs' hypotheses rotated by one: worse than a.
		c = append(c, string(rune('一'+(i+1)%50))+r[3:9]+wrong)
	}
	if lo, hi, p := BLEUDiff(a, a, refs, 4, 200, 0.95, 3); lo != 0 || hi != 0 || p != 0 {
		t.Errorf("a against itself: [%v, %v], higher in %v, want [0, 0], 0", lo, hi, p)
	}
	lo, hi, p := BLEUDiff(a, b, refs, 4, 400, 0.95, 3)
	d := BLEU(b, refs, 4) - BLEU(a, refs, 4)
	if !(lo > 0 && lo <= d && d <= hi && p == 1) {
		t.Errorf("b better on every pair: Δ %v, interval [%v, %v], higher in %v; want 0 < lo ≤ Δ ≤ hi, 1", d, lo, hi, p)
	}
	if lo, hi, p := BLEUDiff(a, c, refs, 2, 400, 0.95, 3); !(hi < 0 && lo <= hi && p == 0) {
		t.Errorf("c worse on every pair: interval [%v, %v], higher in %v; want hi < 0, 0", lo, hi, p)
	}
	if lo2, hi2, p2 := BLEUDiff(a, b, refs, 4, 400, 0.95, 3); lo2 != lo || hi2 != hi || p2 != p {
		t.Errorf("same seed, other result: [%v, %v] %v then [%v, %v] %v", lo, hi, p, lo2, hi2, p2)
	}
}
