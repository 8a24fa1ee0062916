package bench

import (
	"sort"
	"time"

	"chunlian/stats"
)

// Summary describes a set of durations in milliseconds. The zero value (N ==
// 0) means "no samples"; every field is then 0 and the report prints "—".
type Summary struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	Min  float64 `json:"min_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

// Summarize computes the summary of ds. It does not modify ds.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	ms := make([]float64, len(ds)) // ms[i] = ds[i] in milliseconds, then sorted
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
	}
	return summarizeMS(ms)
}

// summarizeMS summarises millisecond values; it sorts ms in place.
func summarizeMS(ms []float64) Summary {
	if len(ms) == 0 {
		return Summary{}
	}
	sort.Float64s(ms)
	sum := 0.0
	for _, v := range ms {
		sum += v
	}
	return Summary{
		N:    len(ms),
		Mean: sum / float64(len(ms)),
		Min:  ms[0],
		P50:  stats.Percentile(ms, 50),
		P90:  stats.Percentile(ms, 90),
		P99:  stats.Percentile(ms, 99),
		Max:  ms[len(ms)-1],
	}
}

// Rate returns count/elapsed in events per second, 0 when elapsed ≤ 0.
func Rate(count int, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(count) / elapsed.Seconds()
}

// Bucket is one cumulative histogram bucket, like Prometheus: Count samples
// were ≤ LeMS milliseconds. The last bucket has LeMS = +Inf, written to JSON
// as the string "+Inf" by the Inf flag because JSON has no infinity.
type Bucket struct {
	LeMS  float64 `json:"le_ms"`
	Inf   bool    `json:"inf,omitempty"`
	Count int     `json:"count"`
}

// DefaultBucketsMS are the latency histogram bounds in milliseconds: they cover
// a sub-millisecond GPU step up to a multi-second CPU queue.
var DefaultBucketsMS = []float64{1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000}

// Histogram returns cumulative buckets for ds over the ascending bounds (ms)
// plus a final +Inf bucket holding len(ds). A sample equal to a bound falls in
// that bound's bucket (le = "less or equal").
func Histogram(ds []time.Duration, boundsMS []float64) []Bucket {
	out := make([]Bucket, len(boundsMS)+1) // one per bound, then +Inf
	for i, b := range boundsMS {
		out[i].LeMS = b
	}
	out[len(boundsMS)].Inf = true
	out[len(boundsMS)].LeMS = 0 // JSON cannot carry +Inf; Inf flags it
	for _, d := range ds {
		ms := float64(d) / float64(time.Millisecond)
		// First bound ≥ ms; every later bucket counts it too (cumulative).
		i := sort.SearchFloat64s(boundsMS, ms)
		for j := i; j < len(boundsMS); j++ {
			out[j].Count++
		}
	}
	out[len(boundsMS)].Count = len(ds)
	return out
}
