package engine

import (
	"runtime"
	"sync"
	"sync/atomic"

	"chunlian/sampler"
)

// minRowsPerWorker: a sampling worker is started only for every this many
// logits rows of a step. A row costs several µs (a log-sum-exp and a
// softmax over the vocabulary); starting a goroutine and waiting for it
// costs about 1 µs.
const minRowsPerWorker = 2

// sampleTask is one sequence's draw in one step: inputs set by the engine
// goroutine before rowSampler.run, outputs written by the one worker that
// handles its row.
type sampleTask struct {
	s    *sequence
	row  int32 // logits row it samples from
	plan int32 // its device-draw plan: index into drawPlan.tasks (draws.go)

	tok int32   // drawn token (valid when err == nil)
	lp  float32 // its raw log-prob
	err error   // from the processor (sampler.ErrDeadEnd or another)
}

// rowSampler runs the parallel phase of a step (see Paged.consume). It is
// part of the engine loop's state: the loop fills tasks, calls run and
// reads the outputs after run returns. During run, worker w owns
// scratch[w]; rows are handed out by the atomic counter next, and every
// row's tasks and lse entry are written by the worker that took the row.
type rowSampler struct {
	tasks   []sampleTask // in row order (the engine lists them so)
	rowTask []int32      // [rows+1]: row i's tasks are tasks[rowTask[i]:rowTask[i+1]]
	scratch []*sampler.Scratch

	// Per-run inputs, read by the workers.
	logits []float32 // [rows, V]
	lse    []float64 // [rows]
	V      int
	next   atomic.Int64
}

// run samples every task and fills lse's NaN entries for the rows without
// tasks (prompt rows, scored by the caller) or with several, with up to workers
// goroutines, the caller's being one of them. logits is [rows, V], lse
// [rows]. The results do not depend on workers: every row is done by the
// same code from the same inputs.
func (rs *rowSampler) run(logits []float32, V, rows int, lse []float64, workers int) {
	if cap(rs.rowTask) < rows+1 {
		rs.rowTask = make([]int32, rows+1)
	}
	rs.rowTask = rs.rowTask[:rows+1]
	t := 0
	for i := 0; i <= rows; i++ {
		for t < len(rs.tasks) && int(rs.tasks[t].row) < i {
			t++
		}
		rs.rowTask[i] = int32(t)
	}
	for len(rs.scratch) < workers {
		rs.scratch = append(rs.scratch, sampler.NewScratch())
	}
	rs.logits, rs.lse, rs.V = logits, lse, V
	rs.next.Store(0)
	if workers <= 1 {
		rs.work(rs.scratch[0], rows)
	} else {
		var wg sync.WaitGroup
		for w := 1; w < workers; w++ {
			wg.Add(1)
			go func(sc *sampler.Scratch) {
				defer wg.Done()
				rs.work(sc, rows)
			}(rs.scratch[w])
		}
		rs.work(rs.scratch[0], rows)
		wg.Wait()
	}
	rs.logits = nil
}

// work takes rows from the shared counter until none is left.
func (rs *rowSampler) work(sc *sampler.Scratch, rows int) {
	for {
		i := int(rs.next.Add(1) - 1)
		if i >= rows {
			return
		}
		rs.doRow(sc, i)
	}
}

// doRow handles row i. A row with one task leaves its log-sum-exp to the
// Sampler (which can read it off the softmax it computes anyway at
// temperature 1); a row shared by several tasks (the N samples of a
// request that just forked) computes it once; a row without tasks is a
// prompt row whose log-sum-exp the caller needs.
func (rs *rowSampler) doRow(sc *sampler.Scratch, i int) {
	row := rs.logits[i*rs.V : (i+1)*rs.V]
	ts := rs.tasks[rs.rowTask[i]:rs.rowTask[i+1]]
	lse := rs.lse[i]
	// A NaN from the backend (say, a row with NaN logits, which the host
	// LSE skips) counts as unknown too.
	if lse != lse && len(ts) != 1 {
		lse = sc.LogSumExp(row)
		rs.lse[i] = lse
	}
	for k := range ts {
		t := &ts[k]
		s := t.s
		t.tok, t.lp, t.err = s.samp.SampleWith(sc, row, lse, s.r.req.Prompt, s.generated(), s.proc)
	}
}

// samplingWorkers is the number of goroutines (the engine goroutine
// included) for a step with rows logits rows: Config.SamplingWorkers (0 =
// GOMAXPROCS), but at least minRowsPerWorker rows each, since a goroutine
// hand-off costs about as much as a fraction of one row.
func (e *Paged) samplingWorkers(rows int) int {
	w := e.cfg.SamplingWorkers
	if w == 0 {
		w = runtime.GOMAXPROCS(0)
	}
	return max(1, min(w, rows/minRowsPerWorker))
}
