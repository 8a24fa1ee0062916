// Package stats holds the summary statistics shared by the service's
// dashboard (server), the load tester (bench) and the evaluation (quality,
// cmd/chunlian eval), so that a p99 means the same everywhere.
package stats

import "math"

// Percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of
// sorted, which must be sorted ascending: the smallest sample such that at
// least p% of the samples are ≤ it, i.e. sorted[ceil(p/100·n)-1]. Nearest
// rank never invents a value that was not observed, which is what a
// latency report wants (p99 of 10 samples is the maximum). p ≤ 0 gives the
// minimum. An empty slice gives 0.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	// The small epsilon keeps e.g. 0.9·10 = 9.000000000000002 from rounding
	// up to rank 10 through floating-point noise.
	rank := int(math.Ceil(p/100*float64(n) - 1e-9))
	return sorted[min(max(rank, 1), n)-1]
}
