package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"chunlian/sampler"
)

// BenchmarkSampleRows is one big decode step's sampling phase alone: 1024
// sequences, each sampling its own row of V = 6294 (the shipped
// vocabulary) Zipf-like logits, as at 1024 sequences on the GPU host:
//
//   - before: what the engine did until the sampling phase went parallel
//     (row log-sum-exps split over GOMAXPROCS goroutines, then every
//     processor and Sampler in turn on the engine goroutine, each Sampler
//     with its own buffers);
//   - workers=1 / workers=GOMAXPROCS: rowSampler.run, one goroutine or
//     as many as the machine has;
//   - backend-lse: as workers=GOMAXPROCS with the log-sum-exps supplied
//     by the backend (forward.RowLSEBackend, the GPU's row_lse).
//
// cpu-ns/row (process CPU time per row) is the figure that transfers: on
// an idle host with P cores the parallel phase takes about cpu-ns/row / P
// of wall time per row; ns/row (wall) also shows what else ran.
func BenchmarkSampleRows(b *testing.B) {
	const rows, V = 1024, 6294
	rng := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, rows*V)
	for i := 0; i < rows; i++ {
		// Token of rank r (a per-row shuffle) has logit 8 − 2.5·ln(1+r).
		for r, tok := range rng.Perm(V) {
			logits[i*V+tok] = float32(8 - 2.5*math.Log(1+float64(r)) + 0.1*rng.NormFloat64())
		}
	}
	// mask stands for couplet's constraint: read-only, forbids a tenth of
	// the vocabulary.
	mask := sampler.LogitsProcessorFunc(func(_ []int32, l []float32) error {
		for i := 0; i < len(l); i += 10 {
			l[i] = float32(math.Inf(-1))
		}
		return nil
	})
	cases := []struct {
		name string
		p    sampler.Params
		proc sampler.LogitsProcessor
	}{
		{"greedy", sampler.Params{}, nil},
		{"T=1", sampler.Params{Temperature: 1, Seed: 1}, nil},
		{"couplet", sampler.Params{Temperature: 0.8, TopP: 0.95, Seed: 1}, mask},
	}
	P := runtime.GOMAXPROCS(0)
	for _, c := range cases {
		seqs := make([]*sequence, rows)
		for i := range seqs {
			r := &request{req: &Request{Prompt: []int32{1, 2, 3, 4, 5, 6, 7, 8}, Params: c.p}}
			seqs[i] = &sequence{r: r, tokens: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, samp: sampler.New(c.p, i), proc: c.proc}
		}
		lse := make([]float64, rows)
		b.Run(c.name+"/before", func(b *testing.B) {
			c0 := cpuTime()
			for b.Loop() {
				beforeRowsLogSumExp(logits, lse, V, rows)
				for i, s := range seqs {
					s.samp.SampleLSE(logits[i*V:(i+1)*V], lse[i], s.r.req.Prompt, s.generated(), s.proc)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(rows*b.N), "ns/row")
			b.ReportMetric(float64((cpuTime()-c0).Nanoseconds())/float64(rows*b.N), "cpu-ns/row")
		})
		for _, mode := range []struct {
			name    string
			workers int
			haveLSE bool
		}{{"workers=1", 1, false}, {fmt.Sprintf("workers=%d", P), P, false}, {fmt.Sprintf("backend-lse/workers=%d", P), P, true}} {
			b.Run(c.name+"/"+mode.name, func(b *testing.B) {
				var rs rowSampler
				for i, s := range seqs {
					rs.tasks = append(rs.tasks, sampleTask{s: s, row: int32(i)})
				}
				if mode.haveLSE {
					beforeRowsLogSumExp(logits, lse, V, rows)
				}
				c0 := cpuTime()
				for b.Loop() {
					if !mode.haveLSE {
						for i := range lse {
							lse[i] = math.NaN()
						}
					}
					rs.run(logits, V, rows, lse, mode.workers)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(rows*b.N), "ns/row")
				b.ReportMetric(float64((cpuTime()-c0).Nanoseconds())/float64(rows*b.N), "cpu-ns/row")
			})
		}
	}
}

// beforeRowsLogSumExp is the engine's former rowsLogSumExp: the rows'
// log-sum-exps over GOMAXPROCS short-lived goroutines, strided.
func beforeRowsLogSumExp(logits []float32, lse []float64, V, rows int) {
	workers := min(runtime.GOMAXPROCS(0), rows/2)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < rows; i += workers {
				lse[i] = sampler.LogSumExp(logits[i*V : (i+1)*V])
			}
		}()
	}
	wg.Wait()
}
