package bench

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func ms(v ...float64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		in   []time.Duration
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one", ms(42), Summary{N: 1, Mean: 42, Min: 42, P50: 42, P90: 42, P99: 42, Max: 42}},
		// sorted 10 20 30 40: mean 25; p50 rank 2; p90 rank ceil(3.6)=4.
		{"four unsorted", ms(30, 10, 40, 20), Summary{N: 4, Mean: 25, Min: 10, P50: 20, P90: 40, P99: 40, Max: 40}},
		// 1..10 ms: mean 5.5; p50 rank 5; p90 rank 9; p99 rank 10.
		{"ten", ms(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), Summary{N: 10, Mean: 5.5, Min: 1, P50: 5, P90: 9, P99: 10, Max: 10}},
		{"sub-millisecond", ms(0.25, 0.75), Summary{N: 2, Mean: 0.5, Min: 0.25, P50: 0.25, P90: 0.75, P99: 0.75, Max: 0.75}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.in)
			got := Summarize(in)
			if got != tc.want {
				t.Errorf("Summarize = %+v, want %+v", got, tc.want)
			}
			if !slices.Equal(in, tc.in) {
				t.Errorf("Summarize modified its input")
			}
		})
	}
}

func TestRate(t *testing.T) {
	tests := []struct {
		count   int
		elapsed time.Duration
		want    float64
	}{
		{30, 2 * time.Second, 15},
		{5, 250 * time.Millisecond, 20},
		{0, time.Second, 0},
		{10, 0, 0},
		{10, -time.Second, 0},
		{1, 4 * time.Second, 0.25},
	}
	for _, tc := range tests {
		if got := Rate(tc.count, tc.elapsed); got != tc.want {
			t.Errorf("Rate(%d, %v) = %g, want %g", tc.count, tc.elapsed, got, tc.want)
		}
	}
}

func TestHistogram(t *testing.T) {
	tests := []struct {
		name   string
		in     []time.Duration
		bounds []float64
		want   []int // cumulative counts per bound, then +Inf
	}{
		// ≤10: 5,10 → 2; ≤50: +11,50 → 4; ≤100: +99,100 → 6; +Inf: 8.
		{"edges inclusive", ms(5, 10, 11, 50, 99, 100, 101, 1000), []float64{10, 50, 100}, []int{2, 4, 6, 8}},
		{"empty", nil, []float64{1, 2}, []int{0, 0, 0}},
		{"all above", ms(7, 8), []float64{1, 2}, []int{0, 0, 2}},
		{"all below", ms(0.5, 0.1), []float64{1, 2}, []int{2, 2, 2}},
		{"no bounds", ms(3), nil, []int{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Histogram(tc.in, tc.bounds)
			if len(got) != len(tc.want) {
				t.Fatalf("%d buckets, want %d", len(got), len(tc.want))
			}
			for i, b := range got {
				if b.Count != tc.want[i] {
					t.Errorf("bucket %d count %d, want %d", i, b.Count, tc.want[i])
				}
				if last := i == len(got)-1; b.Inf != last || (!last && b.LeMS != tc.bounds[i]) {
					t.Errorf("bucket %d = %+v: wrong bound", i, b)
				}
			}
		})
	}
}

func TestGain(t *testing.T) {
	tests := []struct {
		base, opt float64
		better    int
		want      float64
		ok        bool
	}{
		{400, 100, -1, 4, true}, // latency 400 ms → 100 ms is 4× better
		{2.5, 20, +1, 8, true},  // QPS 2.5 → 20 is 8×
		{0, 20, +1, 0, false},   // no baseline throughput: undefined
		{100, 0, -1, 0, false},  // zero latency: undefined
		{10, 5, +1, 0.5, true},  // a regression shows as < 1×
		{1, 1, 0, 0, false},     // rows without a direction have no gain
	}
	for _, tc := range tests {
		got, ok := Gain(tc.base, tc.opt, tc.better)
		if ok != tc.ok || got != tc.want {
			t.Errorf("Gain(%g, %g, %d) = %g, %v; want %g, %v", tc.base, tc.opt, tc.better, got, ok, tc.want, tc.ok)
		}
	}
}

func TestFormat(t *testing.T) {
	tests := []struct {
		v        float64
		ms, rate string
	}{
		{0.123, "0.12 ms", "0.12"},
		{55, "55.0 ms", "55.0"},
		{182.4, "182 ms", "182"},
		{12345, "12.3 s", "12345"},
		{2500, "2.50 s", "2500"},
		{math.NaN(), "—", "NaN"},
	}
	for _, tc := range tests {
		if got := fmtMS(tc.v); got != tc.ms {
			t.Errorf("fmtMS(%g) = %q, want %q", tc.v, got, tc.ms)
		}
		if got := fmtRate(tc.v); got != tc.rate {
			t.Errorf("fmtRate(%g) = %q, want %q", tc.v, got, tc.rate)
		}
	}
}

func TestWords(t *testing.T) {
	if len(BlessingWords) < 50 {
		t.Errorf("%d blessing words, want ≥ 50", len(BlessingWords))
	}
	seen := map[string]bool{}
	for _, w := range BlessingWords {
		if countHan(w) != 2 || len([]rune(w)) != 2 {
			t.Errorf("blessing word %q is not two Han characters", w)
		}
		if seen[w] {
			t.Errorf("duplicate blessing word %q", w)
		}
		seen[w] = true
	}
	for _, u := range UpperLines {
		if n := len([]rune(u)); countHan(u) != n || (n != 5 && n != 7) {
			t.Errorf("上联 %q: want 5 or 7 Han characters", u)
		}
	}
}

func TestPromptSource(t *testing.T) {
	a, b := newPromptSource(7, []string{"keyword", "lower"}), newPromptSource(7, []string{"keyword", "lower"})
	c := newPromptSource(8, []string{"keyword", "lower"})
	differs := false
	modes := map[string]int{}
	for i := 0; i < 200; i++ {
		pa, pb, pc := a.next(), b.next(), c.next()
		if pa != pb {
			t.Fatalf("same seed, prompt %d differs: %+v vs %+v", i, pa, pb)
		}
		differs = differs || pa != pc
		modes[pa.Mode]++
		switch pa.Mode {
		case "lower":
			if !slices.Contains(UpperLines, pa.Text) {
				t.Errorf("lower prompt %q not from UpperLines", pa.Text)
			}
		case "keyword":
			if !slices.Contains(BlessingWords, pa.Text) {
				t.Errorf("keyword prompt %q not from BlessingWords", pa.Text)
			}
		default:
			t.Errorf("unexpected mode %q", pa.Mode)
		}
		if pa.Seed > math.MaxInt64 {
			t.Errorf("seed %d does not fit int64", pa.Seed)
		}
	}
	if !differs {
		t.Errorf("seeds 7 and 8 gave the same 200 prompts")
	}
	if modes["lower"] == 0 || modes["keyword"] == 0 {
		t.Errorf("mode mix %v: both modes expected", modes)
	}
}

func TestParseModes(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{"keyword", []string{"keyword"}, ""},
		{"keyword, acrostic,lower", []string{"keyword", "acrostic", "lower"}, ""},
		{"keyword,poem", nil, "unknown mode"},
		{" , ", nil, "no mode"},
	}
	for _, tc := range tests {
		got, err := ParseModes(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseModes(%q) error %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseModes(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestSummarizeLevelWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(startS, latS float64, o outcome, tokens int) sample {
		return sample{start: t0.Add(time.Duration(startS * float64(time.Second))),
			latency: time.Duration(latS * float64(time.Second)), outcome: o, tokens: tokens, couplets: 1}
	}
	stop := t0.Add(10 * time.Second)
	counted := []sample{
		at(0, 0.5, outcomeOK, 10),      // ends 0.5: in window
		at(1, 2, outcomeOK, 10),        // ends 3: in window
		at(9, 1, outcomeOK, 10),        // ends 10: in window (inclusive)
		at(9.5, 1, outcomeOK, 10),      // ends 10.5: counted, not in the window's throughput
		at(4, 1, outcomeFailed, 0),     // failed: never throughput
		at(5, 0.1, outcomeRejected, 0), // rejected
	}
	counted[4].err = "HTTP 500"
	early := []sample{
		at(-3, 2, outcomeOK, 10),    // ends -1: before the window
		at(-1, 10.9, outcomeOK, 10), // ends 9.9: warm-up request completing in the window
	}
	r := summarizeLevel(Level{Shape: "closed", Concurrency: 2}, counted, early, t0, stop)
	// By hand: counted 6 = 4 ok + 1 failed + 1 rejected; in-window completions
	// 0.5, 3, 10 and the early one at 9.9 → 4 in 10 s = 0.4/s, 40 tokens → 4/s.
	if r.Sent != 6 || r.Completed != 4 || r.Failed != 1 || r.Rejected != 1 || r.Errors["HTTP 500"] != 1 {
		t.Errorf("counts %+v", r)
	}
	if r.WindowS != 10 || r.CompletedInWindow != 4 || r.ReqPerSec != 0.4 || r.CoupletsPerSec != 0.4 || r.TokensPerSec != 4 {
		t.Errorf("window %g s, %d in window, %g req/s, %g couplets/s, %g tokens/s; want 10, 4, 0.4, 0.4, 4",
			r.WindowS, r.CompletedInWindow, r.ReqPerSec, r.CoupletsPerSec, r.TokensPerSec)
	}
	// Latency over the 4 counted completed: 0.5, 2, 1, 1 s → mean 1.125 s.
	if r.Latency.N != 4 || r.Latency.Mean != 1125 || r.Latency.Max != 2000 || r.OutputTokens != 40 {
		t.Errorf("latency %+v tokens %d", r.Latency, r.OutputTokens)
	}
	// A window that never opened (stop before t0) gives no rate, not a division by zero.
	if z := summarizeLevel(Level{}, nil, nil, t0, t0.Add(-time.Second)); z.ReqPerSec != 0 || z.WindowS != 0 {
		t.Errorf("empty level: %+v", z)
	}
}
