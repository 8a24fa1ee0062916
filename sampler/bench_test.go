package sampler

import (
	"math"
	"math/rand/v2"
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

// BenchmarkSampleRow: one SampleWith call on a row of V = 6294 (the
// shipped vocabulary) Zipf-like logits, a fresh row each call from a set
// of 64 (as engine's BenchmarkSampleRows: the token of rank r has logit
// 8 − 2.5·ln(1+r)), with the couplet pipeline's parameters (T = 0.8,
// top-p 0.95) and a processor that forbids a tenth of the vocabulary, with
// the row's log-sum-exp known (lse, as from the GPU's row_lse) or not.
// CHUNLIAN_GEMM=go runs the kernels' plain-Go versions for A/B. The
// flat cases are rows of normal logits (σ 1.5) whose top-p nucleus is
// thousands of tokens. The forced cases are a row a Forcer forces to one token, through Forced or
// with Forced hidden ("full"); forceProc fills the row with a store per
// entry, couplet's force with copies (its BenchmarkSampleRow).
func BenchmarkSampleRow(b *testing.B) {
	const V, nrows = 6294, 64
	rng := rand.New(rand.NewPCG(3, 4))
	rows := make([][]float32, nrows)
	lses := make([]float64, nrows)
	for i := range rows {
		rows[i] = make([]float32, V)
		for r, tok := range rng.Perm(V) {
			rows[i][tok] = float32(8 - 2.5*math.Log(1+float64(r)) + 0.1*rng.NormFloat64())
		}
		lses[i] = LogSumExp(rows[i])
	}
	// Flat rows (a line's first character, a 横批 the model writes
	// itself): normal logits, σ = 1.5, so that at T = 0.8 the top-p 0.95
	// nucleus is most of the vocabulary.
	flat := make([][]float32, nrows)
	flatLse := make([]float64, nrows)
	for i := range flat {
		flat[i] = make([]float32, V)
		for tok := range flat[i] {
			flat[i][tok] = float32(1.5 * rng.NormFloat64())
		}
		flatLse[i] = LogSumExp(flat[i])
	}
	mask := LogitsProcessorFunc(func(_ []int32, l []float32) error {
		for i := 0; i < len(l); i += 10 {
			l[i] = float32(math.Inf(-1))
		}
		return nil
	})
	couplet := Params{Temperature: 0.8, TopP: 0.95, Seed: 1}
	for _, tc := range []struct {
		name string
		p    Params
		proc LogitsProcessor
		lse  bool
		flat bool
	}{
		{"couplet+processor/lse", couplet, mask, true, false},
		{"couplet+processor", couplet, mask, false, false},
		{"couplet/lse", couplet, nil, true, false},
		{"greedy", Params{}, nil, false, false},
		{"T=1", Params{Temperature: 1, Seed: 1}, nil, false, false},
		{"top-k 50/lse", Params{Temperature: 0.8, TopK: 50, Seed: 1}, nil, true, false},
		{"flat couplet/lse", couplet, nil, true, true},
		{"flat couplet+processor/lse", couplet, mask, true, true},
		{"flat top-k 50/lse", Params{Temperature: 0.8, TopK: 50, Seed: 1}, nil, true, true},
		{"flat top-k 1000/lse", Params{Temperature: 0.8, TopK: 1000, Seed: 1}, nil, true, true},
		// A row forced to one token (a Forcer): through Forced, or with
		// Forced hidden (the full path: copy, processor, scans, draw).
		{"forced/lse", couplet, forceProc{1234}, true, false},
		{"forced/lse/full", couplet, processOnly{forceProc{1234}}, true, false},
		{"forced", couplet, forceProc{1234}, false, false},
		{"forced/full", couplet, processOnly{forceProc{1234}}, false, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := New(tc.p, 0)
			sc := NewScratch()
			hist := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
			i := 0
			c0 := cpuTime()
			for b.Loop() {
				row, lse := rows[i%nrows], lses[i%nrows]
				if tc.flat {
					row, lse = flat[i%nrows], flatLse[i%nrows]
				}
				if !tc.lse {
					lse = math.NaN()
				}
				s.SampleWith(sc, row, lse, hist, hist, tc.proc)
				i++
			}
			b.ReportMetric(float64((cpuTime()-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
