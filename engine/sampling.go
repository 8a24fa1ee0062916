package engine

import (
	"runtime"
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
// scratch[w]; rows are handed out by the run's atomic counter, and every
// row's tasks and lse entry are written by the worker that took the row.
type rowSampler struct {
	tasks   []sampleTask // in row order (the engine lists them so)
	rowTask []int32      // [rows+1]: row i's tasks are tasks[rowTask[i]:rowTask[i+1]]
	scratch []*sampler.Scratch
}

// sampleRun is one call of rowSampler.run: its inputs, read by the
// workers, and its counters. A helper goroutine the scheduler starts only
// after every row was taken finds its run's counter spent and returns,
// touching nothing else (not its Scratch, nor a later run's inputs), so
// run waits for the rows taken, never for helpers still queued for a CPU:
// on a busy server those can wait hundreds of µs.
type sampleRun struct {
	tasks   []sampleTask
	rowTask []int32
	logits  []float32 // [rows, V]
	lse     []float64 // [rows]
	V, rows int
	next    atomic.Int64  // rows handed out
	done    atomic.Int64  // rows finished
	last    chan struct{} // capacity 1: the helper finishing the last row sends
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
	sr := &sampleRun{tasks: rs.tasks, rowTask: rs.rowTask, logits: logits, lse: lse, V: V, rows: rows}
	if workers <= 1 || rows == 0 {
		sr.work(rs.scratch[0])
		return
	}
	sr.last = make(chan struct{}, 1)
	for w := 1; w < workers; w++ {
		go sr.work(rs.scratch[w])
	}
	if !sr.work(rs.scratch[0]) {
		<-sr.last // a helper still holds a row; it sends when it finishes the last
	}
}

// work takes rows from the run's counter until none is left, and reports
// whether it finished the run's last row (then no one else is working on
// it). A helper that finishes the last row signals the caller.
func (sr *sampleRun) work(sc *sampler.Scratch) (finishedLast bool) {
	for {
		i := int(sr.next.Add(1) - 1)
		if i >= sr.rows {
			return finishedLast
		}
		sr.doRow(sc, i)
		if sr.done.Add(1) == int64(sr.rows) {
			finishedLast = true
			if sr.last != nil {
				sr.last <- struct{}{}
			}
		}
	}
}

// doRow handles row i. A row with one task leaves its log-sum-exp to the
// Sampler (which can read it off the softmax it computes anyway at
// temperature 1); a row shared by several tasks (the N samples of a
// request that just forked) computes it once; a row without tasks is a
// prompt row whose log-sum-exp the caller needs.
func (sr *sampleRun) doRow(sc *sampler.Scratch, i int) {
	row := sr.logits[i*sr.V : (i+1)*sr.V]
	ts := sr.tasks[sr.rowTask[i]:sr.rowTask[i+1]]
	lse := sr.lse[i]
	// A NaN from the backend (say, a row with NaN logits, which the host
	// LSE skips) counts as unknown too.
	if lse != lse && len(ts) != 1 {
		lse = sc.LogSumExp(row)
		sr.lse[i] = lse
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
