package stats

import "testing"

// seq returns lo..hi as floats.
func seq(lo, hi int) []float64 {
	var s []float64
	for i := lo; i <= hi; i++ {
		s = append(s, float64(i))
	}
	return s
}

func TestPercentile(t *testing.T) {
	// Expected values by hand from the nearest-rank rule: rank = ceil(p/100·n).
	tests := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"empty", nil, 50, 0},
		{"single p50", []float64{7}, 50, 7},
		{"single p99", []float64{7}, 99, 7},
		{"1..10 p50 rank 5", seq(1, 10), 50, 5},
		{"1..10 p90 rank 9 (no float round-up)", seq(1, 10), 90, 9},
		{"1..10 p95 rank ceil(9.5)=10", seq(1, 10), 95, 10},
		{"1..10 p99 is the max", seq(1, 10), 99, 10},
		{"1..10 p10 rank 1", seq(1, 10), 10, 1},
		{"1..10 p0 is the min", seq(1, 10), 0, 1},
		{"1..10 p100", seq(1, 10), 100, 10},
		{"1..4 p50 rank 2", seq(1, 4), 50, 2},
		{"1..4 p75 rank 3", seq(1, 4), 75, 3},
		{"1..4 p76 rank ceil(3.04)=4", seq(1, 4), 76, 4},
		{"1..100 p99 rank 99", seq(1, 100), 99, 99},
		{"1..100 p90 rank 90", seq(1, 100), 90, 90},
		{"1..100 p50 rank 50", seq(1, 100), 50, 50},
		{"1..1000 p99 rank 990", seq(1, 1000), 99, 990},
		{"1..1000 p99.9 rank 999", seq(1, 1000), 99.9, 999},
		{"uneven", []float64{2, 3, 5, 8, 13}, 50, 5},
		{"uneven p90 rank ceil(4.5)=5", []float64{2, 3, 5, 8, 13}, 90, 13},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.sorted, tc.p); got != tc.want {
				t.Errorf("Percentile(%v, %g) = %g, want %g", tc.sorted, tc.p, got, tc.want)
			}
		})
	}
}
