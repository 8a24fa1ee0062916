package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
)

// collector gathers the samples of one level. Workers add under mu; runLevel
// reads only after every worker has returned.
type collector struct {
	mu      sync.Mutex
	samples []sample // counted requests (sent inside the window)
	early   []sample // completed requests sent before the window (warm-up)
	// Live counters for the progress display (atomics: read by the ticker).
	done, failed, rejected atomic.Int64
	dropped                atomic.Int64 // open loop: arrivals not sent (in-flight cap)
	refused                atomic.Int64 // requests refused at connect (warm-up included) before any answer
	answered               atomic.Bool  // some request (warm-up included) succeeded
	// onUnreachable is called once refused reaches refusedAbort with no
	// success: the target is gone, so the level (and run) stop.
	onUnreachable func()
}

// refusedAbort is how many refused connections, with no request answered
// yet, end a level: a service that went away fails fast instead of
// filling a table with thousands of refused requests.
const refusedAbort = 20

func (c *collector) add(s sample) {
	if s.outcome == outcomeAborted {
		return // our own cancellation says nothing about the server
	}
	switch s.outcome {
	case outcomeOK:
		c.done.Add(1)
	case outcomeFailed:
		c.failed.Add(1)
	case outcomeRejected:
		c.rejected.Add(1)
	}
	c.mu.Lock()
	c.samples = append(c.samples, s)
	c.mu.Unlock()
}

// addEarly keeps a completed warm-up request: it does not enter the level's
// counts or latency, but its completion inside the window is throughput.
func (c *collector) addEarly(s sample) {
	if s.outcome != outcomeOK {
		return
	}
	c.mu.Lock()
	c.early = append(c.early, s)
	c.mu.Unlock()
}

// record hands s to the collector as counted or early.
func (c *collector) record(s sample, counted bool) {
	if s.outcome == outcomeOK {
		c.answered.Store(true)
	}
	if s.err == "transport: connection refused" && !c.answered.Load() && c.refused.Add(1) == refusedAbort && c.onUnreachable != nil {
		c.onUnreachable()
	}
	if counted {
		c.add(s)
	} else {
		c.addEarly(s)
	}
}

// Counting rules, the same for both shapes. A level runs a warm-up of
// o.Warmup, then a window that opens at t0 = start + o.Warmup. Sending stops
// at tEnd = t0 + o.Duration, or (with o.Requests > 0) when the o.Requests-th
// counted request has been sent; stop is the first moment a send was refused,
// capped at tEnd.
//
//   - A request is *counted* iff it was sent in [t0, stop). Every counted
//     request is awaited (bounded by o.Timeout); completed/failed/rejected
//     and the latency, TTFT and TPOT statistics are over counted requests.
//   - Throughput (req/s, couplets/s, tokens/s) is the number of successful
//     completions of *any* request (warm-up ones included) inside
//     [t0, stop], divided by stop − t0. In steady state this is the service
//     rate; dividing counted completions by "t0 → last completion" instead
//     would be biased low by a factor D/(D+latency).

// errUnreachable ends a level whose first refusedAbort requests were all
// refused at connect.
var errUnreachable = errors.New("connection refused: the service is not reachable")

// runLevel measures one level. It returns early, with Partial set, when ctx
// ends.
func runLevel(ctx context.Context, cl *client, t Target, lv Level, o Options, src *promptSource, prog progress) LevelResult {
	start := time.Now()
	t0 := start.Add(o.Warmup)
	tEnd := t0.Add(o.Duration)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	col := &collector{onUnreachable: func() { cancel(errUnreachable) }}
	var issued atomic.Int64 // counted requests sent so far
	var stopOnce sync.Once
	stop := tEnd // written once under stopOnce, read after wg.Wait

	// claim decides, just before a send at time now, whether to send at all
	// and whether the request is counted. The first refusal fixes stop.
	claim := func(now time.Time) (send, counted bool) {
		refuse := func(at time.Time) (bool, bool) {
			stopOnce.Do(func() {
				if at.Before(tEnd) {
					stop = at
				}
			})
			return false, false
		}
		if ctx.Err() != nil {
			return refuse(time.Now()) // now may be a future arrival time
		}
		if !now.Before(tEnd) {
			return refuse(now)
		}
		if now.Before(t0) {
			return true, false
		}
		if o.Requests > 0 && issued.Add(1) > int64(o.Requests) {
			return refuse(now)
		}
		return true, true
	}

	mon := startMonitor(ctx, cl, t, t0)
	stopProg := prog.level(fmt.Sprintf("%s %s", t.Name, lv), o, start, col)

	var wg sync.WaitGroup
	switch lv.Shape {
	case "closed":
		for w := 0; w < lv.Concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				closedUser(ctx, cl, src, o, col, claim)
			}()
		}
	case "open":
		// Poisson arrivals: exponential gaps with mean 1/rate from a seeded
		// generator, scheduled on absolute times so a late wake-up does not
		// lower the offered rate (the next arrivals are sent at once).
		rng := rand.New(rand.NewPCG(o.Seed, uint64(lv.Rate*1000)))
		var inflight atomic.Int64
		next := start
		for {
			next = next.Add(time.Duration(rng.ExpFloat64() / lv.Rate * float64(time.Second)))
			if d := time.Until(next); d > 0 {
				sleepCtx(ctx, d)
			}
			send, counted := claim(next)
			if !send {
				break
			}
			if inflight.Load() >= maxInFlightOpen {
				if counted {
					col.dropped.Add(1)
				}
				continue
			}
			inflight.Add(1)
			wg.Add(1)
			p := src.next()
			go func() {
				defer wg.Done()
				defer inflight.Add(-1)
				col.record(cl.do(ctx, p, o.Timeout), counted)
			}()
		}
	}
	wg.Wait()
	mres := mon.stop()
	stopProg()

	res := summarizeLevel(lv, col.samples, col.early, t0, stop)
	res.Dropped = int(col.dropped.Load())
	res.Partial = ctx.Err() != nil
	res.unreachable = errors.Is(context.Cause(ctx), errUnreachable)
	mres.apply(&res)
	return res
}

// closedUser is one simulated user of a closed-loop level: send, wait
// for the answer, repeat while claim allows.
func closedUser(ctx context.Context, cl *client, src *promptSource, o Options, col *collector, claim func(time.Time) (bool, bool)) {
	for {
		send, counted := claim(time.Now())
		if !send {
			return
		}
		s := cl.do(ctx, src.next(), o.Timeout)
		col.record(s, counted)
		if s.outcome == outcomeRejected {
			// A rejected user waits as the server asked (capped) instead
			// of spinning on 503s.
			back := s.retry
			if back <= 0 {
				back = 100 * time.Millisecond
			}
			sleepCtx(ctx, min(back, time.Second))
		}
	}
}

// summarizeLevel turns a level's samples into a LevelResult: counted are the
// requests sent in [t0, stop), early the completed warm-up requests; see the
// counting rules above.
func summarizeLevel(lv Level, counted, early []sample, t0, stop time.Time) LevelResult {
	res := LevelResult{Level: lv, Errors: map[string]int{}}
	var lat, ttft, tpot, server []time.Duration
	for _, s := range counted {
		res.Sent++
		switch s.outcome {
		case outcomeOK:
			res.Completed++
			res.OutputTokens += s.tokens
			res.Couplets += s.couplets
			lat = append(lat, s.latency)
			if s.server > 0 {
				server = append(server, s.server)
			}
			if s.ttft > 0 {
				ttft = append(ttft, s.ttft)
				if s.tokens > 1 {
					tpot = append(tpot, (s.latency-s.ttft)/time.Duration(s.tokens-1))
				}
			}
		case outcomeFailed:
			res.Failed++
			res.Errors[s.err]++
		case outcomeRejected:
			res.Rejected++
		}
	}
	window := max(stop.Sub(t0), 0)
	var done, couplets, tokens int // successful completions inside [t0, stop]
	for _, group := range [][]sample{counted, early} {
		for _, s := range group {
			if end := s.start.Add(s.latency); s.outcome == outcomeOK && !end.Before(t0) && !end.After(stop) {
				done++
				couplets += s.couplets
				tokens += s.tokens
			}
		}
	}
	res.WindowS = window.Seconds()
	res.CompletedInWindow = done
	res.ReqPerSec = Rate(done, window)
	res.CoupletsPerSec = Rate(couplets, window)
	res.TokensPerSec = Rate(tokens, window)
	res.Latency = Summarize(lat)
	res.TTFT = Summarize(ttft)
	res.TPOT = Summarize(tpot)
	res.Server = Summarize(server)
	res.LatencyHistogram = Histogram(lat, DefaultBucketsMS)
	if len(res.Errors) == 0 {
		res.Errors = nil
	}
	return res
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// monitor samples the server's CPU and GPU during a level's window. It runs
// on its own goroutine; stop returns its result once that goroutine is done.
type monitor struct {
	stopc chan struct{}
	donec chan monResult
}

type monResult struct {
	cpuCores  *float64 // server CPU-seconds per wall second over the window
	cpuSource string
	selfCores *float64       // the bench process's own CPU over the window
	gpuUtil   *float64       // mean over scrapes, percent
	gpuMem    *float64       // max over scrapes, bytes
	rss       *float64       // server's resident memory, max over scrapes, bytes
	kvLive    *float64       // chunlian's live share of allocated KV slots, mean over scrapes with any allocated
	rejected  map[string]int // chunlian's rejections over the window, by reason
	engine    *EngineWindow
}

func (m monResult) apply(r *LevelResult) {
	r.CPUCores, r.CPUSource, r.GPUUtilPct, r.GPUMemBytes = m.cpuCores, m.cpuSource, m.gpuUtil, m.gpuMem
	r.BenchCPUCores, r.ServerRSSBytes, r.KVLiveSlots = m.selfCores, m.rss, m.kvLive
	r.RejectedBy = m.rejected
	if m.engine != nil {
		e := *m.engine
		if r.Couplets > 0 {
			e.RowsPerCouplet = e.Rows / float64(r.Couplets)
		}
		r.Engine = &e
	}
}

// readCPU returns the server's CPU seconds: /proc/PID/stat for a spawned
// server, else process_cpu_seconds_total from /metrics; ok=false if neither.
func readCPU(ctx context.Context, cl *client, t Target, m map[string]promValue) (float64, string, bool) {
	if t.PID > 0 {
		if v, err := procCPUSeconds(t.PID); err == nil {
			return v, "proc", true
		}
	}
	if m == nil {
		m = scrape(ctx, cl.hc, cl.base)
	}
	if v, ok := m["process_cpu_seconds_total"]; ok {
		return v.Sum, "metrics", true
	}
	return 0, "", false
}

func startMonitor(ctx context.Context, cl *client, t Target, t0 time.Time) *monitor {
	m := &monitor{stopc: make(chan struct{}), donec: make(chan monResult, 1)}
	go func() {
		var res monResult
		defer func() { m.donec <- res }()
		// Wait for the window to open (the warm-up is not measured).
		select {
		case <-time.After(time.Until(t0)):
		case <-m.stopc:
			return
		}
		var utils []float64
		var memMax, rssMax float64
		var hasMem, hasRSS bool
		var live []float64
		observe := func(pm map[string]promValue) {
			if v, ok := pm["chunlian:kv_cache_live_slots_perc"]; ok && v.Sum > 0 {
				live = append(live, v.Mean())
			}
			if v, ok := pm["process_resident_memory_bytes"]; ok {
				hasRSS, rssMax = true, max(rssMax, v.Sum)
			}
			g := gpuFromProm(pm)
			if g.hasUtil {
				utils = append(utils, g.utilPct)
			}
			if g.hasMem {
				hasMem = true
				memMax = max(memMax, g.memBytes)
			}
		}
		pm := scrape(ctx, cl.hc, cl.base)
		observe(pm)
		eng0 := engineFromProm(pm)
		rej0 := rejectedFromProm(pm)
		cpu0, src, cpuOK := readCPU(ctx, cl, t, pm)
		self0, selfErr := procCPUSeconds(os.Getpid())
		w0 := time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
	loop:
		for {
			select {
			case <-tick.C:
				observe(scrape(ctx, cl.hc, cl.base))
			case <-m.stopc:
				break loop
			}
		}
		// The final reading uses a fresh context: the run's may be cancelled
		// (Ctrl-C) and the partial report still wants its CPU figure.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
		defer cancel()
		pm = scrape(fctx, cl.hc, cl.base)
		observe(pm)
		if eng1 := engineFromProm(pm); eng0.ok && eng1.ok && eng1.steps > eng0.steps {
			n := eng1.steps - eng0.steps
			res.engine = &EngineWindow{
				Steps: n, Rows: eng1.rows - eng0.rows,
				HostMSPerStep:    1000 * (eng1.hostSec - eng0.hostSec) / n,
				ForwardMSPerStep: 1000 * (eng1.fwdSec - eng0.fwdSec) / n,
			}
		}
		res.rejected = rejectedSince(rej0, rejectedFromProm(pm))
		if hasRSS {
			v := rssMax
			res.rss = &v
		}
		res.kvLive = meanOf(live)
		if self1, err := procCPUSeconds(os.Getpid()); err == nil && selfErr == nil {
			if wall := time.Since(w0).Seconds(); wall > 0 {
				v := (self1 - self0) / wall
				res.selfCores = &v
			}
		}
		if cpuOK {
			if cpu1, src1, ok := readCPU(fctx, cl, t, pm); ok && src1 == src {
				if wall := time.Since(w0).Seconds(); wall > 0 {
					v := (cpu1 - cpu0) / wall
					res.cpuCores, res.cpuSource = &v, src
				}
			}
		}
		res.gpuUtil = meanOf(utils)
		if hasMem {
			v := memMax
			res.gpuMem = &v
		}
	}()
	return m
}

// meanOf is the mean of xs, or nil when xs is empty (nothing scraped).
func meanOf(xs []float64) *float64 {
	if len(xs) == 0 {
		return nil
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	v := sum / float64(len(xs))
	return &v
}

func (m *monitor) stop() monResult {
	close(m.stopc)
	return <-m.donec
}

// progress shows a level while it runs. level starts the display and returns
// the function that ends it; the display reads col's atomic counters from its
// own ticker goroutine and never touches col.samples.
type progress interface {
	level(desc string, o Options, start time.Time, col *collector) (stop func())
}

func newProgress(w io.Writer, bar bool) progress {
	switch {
	case w == nil:
		return noProgress{}
	case bar:
		return barProgress{w: w}
	default:
		return lineProgress{w: w}
	}
}

type noProgress struct{}

func (noProgress) level(string, Options, time.Time, *collector) func() { return func() {} }

// counts formats the live counters.
func counts(col *collector) string {
	return fmt.Sprintf("ok=%d failed=%d 503=%d", col.done.Load(), col.failed.Load(), col.rejected.Load())
}

// ticker runs f every d on a new goroutine until the returned stop is called;
// stop waits for that goroutine, so nothing writes after it returns.
func ticker(d time.Duration, f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f()
			case <-quit:
				return
			}
		}
	}()
	return func() { close(quit); <-done }
}

// barProgress draws a schollz/progressbar per level (for terminals). The bar
// tracks time through warm-up + window; with --requests it tracks counted
// requests instead.
type barProgress struct{ w io.Writer }

func (p barProgress) level(desc string, o Options, start time.Time, col *collector) func() {
	total := int64((o.Warmup + o.Duration) / (100 * time.Millisecond))
	byCount := o.Requests > 0
	if byCount {
		total = int64(o.Requests)
	}
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(p.w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionSetRenderBlankState(true),
	)
	update := func() {
		if byCount {
			_ = bar.Set64(col.done.Load() + col.failed.Load() + col.rejected.Load())
		} else {
			_ = bar.Set64(min(total, int64(time.Since(start)/(100*time.Millisecond))))
		}
		bar.Describe(desc + " " + counts(col))
	}
	stop := ticker(250*time.Millisecond, update)
	return func() {
		stop()
		update()
		_ = bar.Finish()
		fmt.Fprintln(p.w)
	}
}

// lineProgress prints a plain line every few seconds (logs, pipes, CI).
type lineProgress struct{ w io.Writer }

func (p lineProgress) level(desc string, o Options, start time.Time, col *collector) func() {
	total := o.Warmup + o.Duration
	line := func(state string) {
		fmt.Fprintf(p.w, "bench: %s %s %.1fs/%.0fs %s\n", desc, state,
			time.Since(start).Seconds(), total.Seconds(), counts(col))
	}
	line("start")
	stop := ticker(5*time.Second, func() { line("running") })
	return func() { stop(); line("done") }
}
