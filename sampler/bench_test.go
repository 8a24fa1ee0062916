package sampler

import (
	"math"
	"testing"
)

// BenchmarkSample: one Sample call on a row of 6000 logits (a smooth
// row: every token is a candidate, the worst case for top-k/top-p), with
// and without a processor. cpu-ns/op is the process's CPU time per call,
// steadier than wall time on a shared machine.
func BenchmarkSample(b *testing.B) {
	row := make([]float32, 6000)
	for i := range row {
		row[i] = float32(math.Sin(float64(i)*0.37)) * 4
	}
	// mask is a processor like couplet's: it forbids a fixed tenth of the
	// vocabulary (read-only state).
	mask := LogitsProcessorFunc(func(_ []int32, l []float32) error {
		for i := 0; i < len(l); i += 10 {
			l[i] = float32(math.Inf(-1))
		}
		return nil
	})
	for _, tc := range []struct {
		name string
		p    Params
		proc LogitsProcessor
	}{
		{"greedy", Params{}, nil},
		{"greedy+processor", Params{}, mask},
		{"temp 1", Params{Temperature: 1, Seed: 1}, nil},
		{"temp", Params{Temperature: 0.8, Seed: 1}, nil},
		{"top-p 0.9", Params{Temperature: 0.8, TopP: 0.9, Seed: 1}, nil},
		{"top-p 0.9+processor", Params{Temperature: 0.8, TopP: 0.9, Seed: 1}, mask},
		{"top-k 50", Params{Temperature: 0.8, TopK: 50, Seed: 1}, nil},
		{"penalty+top-p", Params{Temperature: 0.8, TopP: 0.9, RepetitionPenalty: 1.1, Seed: 1}, nil},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := New(tc.p, 0)
			hist := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
			c0 := cpuTime()
			for b.Loop() {
				s.Sample(row, hist, hist, tc.proc)
			}
			b.ReportMetric(float64((cpuTime()-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
