package server

import (
	"math"
	"sync"
	"time"
	"unicode/utf8"

	"chunlian/couplet"
)

// Adaptive, cost-aware admission with a short queue.
//
// A request's cost is the work it asks for: n candidates × the decode steps
// of one (two lines of the requested length and the 横批). Admission keeps
// the summed cost of requests running in the engine under a budget. The
// budget adapts, AIMD-style, to the latency per decode step that finished
// requests saw (latency / steps: bigger batches raise it), smoothed (EWMA),
// against the unloaded per-step latency: the mean over the last requests
// that ran alone (admitted on an idle server, nobody admitted while they
// ran). While the smoothed latency stays within the factor × that and the
// budget is in use, the budget grows additively; above it, it shrinks
// multiplicatively (at most once per shrinkEvery). Means and smoothing
// matter: on a shared machine single requests vary by several times, and a
// minimum-based baseline shed nearly everything.
//
// A request that does not fit waits in a FIFO queue of bounded cost
// (queueShare of the budget) until running work frees room; its queueing
// delay is the time from arrival to start. A CoDel-style detector watches
// it: when every request that started during an interval waited longer
// than the target while the budget was at its latency limit, a queue stood
// through the interval that the budget could not absorb, so demand exceeds
// what the service can run at that latency (overload), not a passing burst
// or a dip of the budget; refusing within an interval more than both the
// budget and what started says the same. While overloaded (until a Retry-After
// past the last such interval) a request that does not fit is refused at once with 503 and
// Retry-After instead of queueing, and the budget tracks OverloadFactor
// instead of LatencyFactor. So below overload the service runs at the
// batch size of full throughput, and under overload accepted requests keep
// a latency near OverloadFactor × unloaded. Per-step latency alone cannot
// tell the two apart: batching raises it as much as excess load does.
//
// One request is always admitted when nothing runs, whatever its cost, so a
// single large request is never refused or queued on an idle server.

// AdmissionConfig tunes admission; zero values mean the defaults.
type AdmissionConfig struct {
	// LatencyFactor is the smoothed per-step latency, relative to the
	// unloaded mean, above which the budget shrinks (default 6: batching
	// alone makes a step at ten users about 4.6 times slower on two cores
	// with three samples per couplet, so 3 shed load below the knee;
	// docs/DECISIONS.md has the measurements).
	LatencyFactor float64
	// OverloadFactor replaces LatencyFactor while queueing shows overload
	// (default 1.75, at most LatencyFactor: docs/DECISIONS.md).
	OverloadFactor float64
	// QueueTarget is the queueing delay above which a queue that stands for
	// a whole interval means overload (default: half the unloaded latency
	// of a default request); the interval is intervalRatio targets.
	QueueTarget time.Duration
	// InitialBudget is the budget at start, in cost units (default 8
	// default-sized requests); MinBudget the floor (default 1 request).
	InitialBudget, MinBudget float64
	// MaxBudget caps the budget (default 1024 default-sized requests).
	MaxBudget float64
	// Disabled turns adaptive admission off (only MaxInFlight applies).
	Disabled bool
}

const (
	shrinkEvery   = 200 * time.Millisecond
	shrinkFactor  = 0.8
	growPerFinish = 0.25 // of the finished request's cost, per good completion
	aloneSamples  = 32   // unloaded per-step latencies kept for the mean
	minAlone      = 3    // before that many, the budget never shrinks and nothing is overloaded
	ewmaAlpha     = 0.25 // weight of the newest per-step latency
	queueShare    = 0.5  // queued cost bound, as a share of the budget: a wait of about half a request
	targetShare   = 0.5  // default QueueTarget, as a share of the unloaded default request
	intervalRatio = 4    // detector interval / QueueTarget
	// retryAfter is the Retry-After of a refusal: work drains within about
	// one unloaded request, and a second is the smallest the header says.
	retryAfter = time.Second
)

// requestCost is the cost of req in decode steps × candidates. Cheap and
// deterministic: the admission decision must not need the model.
func requestCost(req couplet.Request) float64 {
	return float64(max(req.N, 1)) * requestSteps(req)
}

// requestSteps is the decode steps of one candidate: both lines (with
// their clause commas), the 4-character 横批 and its markers.
func requestSteps(req couplet.Request) float64 {
	n := req.Length
	if req.Mode == couplet.ModeLower {
		n = utf8.RuneCountInString(req.Text)
	}
	if n <= 0 {
		n = couplet.DefaultLength
	}
	return float64(2*n + 8)
}

// defaultCost is the cost of a default request (n=1, 7 characters).
var defaultCost = requestCost(couplet.Request{N: 1})

// admission is the controller; safe for concurrent use.
type admission struct {
	cfg        AdmissionConfig
	now        func() time.Time
	mu         sync.Mutex
	budget     float64
	inflight   float64   // summed cost of started, unfinished requests
	count      int       // started, unfinished requests
	seq        uint64    // starts so far
	alone      []float64 // ring of unloaded per-step latencies (seconds)
	aloneNext  int
	ewma       float64 // smoothed per-step latency of all finished requests; 0 = none yet
	lastShrink time.Time
	queue      []*ticket     // waiting requests, oldest first; non-empty only while count > 0
	queued     float64       // summed cost of the queue
	ivStart    time.Time     // start of the detector's current interval
	ivMin      time.Duration // smallest queueing delay of a start in it; -1 = none yet
	ivRefused  float64       // summed cost of the requests refused in it
	ivStarted  float64       // summed cost of the requests started in it
	ivAtLimit  bool          // the smoothed latency exceeded LatencyFactor × unloaded in it
	overUntil  time.Time     // overloaded before this instant
}

// ticket is one request's record: maybe queued, then started, then
// returned to done.
type ticket struct {
	cost    float64
	arrived time.Time
	ready   chan struct{} // closed when a queued request starts
	started bool
	seq     uint64        // a.seq after this start
	onIdle  bool          // started on an idle server
	wait    time.Duration // queueing delay: arrival to start
}

// verdict is tryAdmit's answer.
type verdict int

const (
	admitted verdict = iota // started at once
	queued                  // started when ticket.ready closes, unless cancelled
	refused                 // 503 with Retry-After
)

func newAdmission(cfg AdmissionConfig, now func() time.Time) *admission {
	if cfg.LatencyFactor == 0 {
		cfg.LatencyFactor = 6
	}
	if cfg.OverloadFactor == 0 {
		cfg.OverloadFactor = math.Min(1.75, cfg.LatencyFactor)
	}
	if cfg.InitialBudget == 0 {
		cfg.InitialBudget = 8 * defaultCost
	}
	if cfg.MinBudget == 0 {
		cfg.MinBudget = defaultCost
	}
	if cfg.MaxBudget == 0 {
		cfg.MaxBudget = 1024 * defaultCost
	}
	if now == nil {
		now = time.Now
	}
	return &admission{cfg: cfg, now: now, budget: cfg.InitialBudget, ivMin: -1}
}

// tryAdmit starts, queues or refuses a request of cost c; a refusal comes
// with the seconds a client should wait before retrying (Retry-After).
func (a *admission) tryAdmit(c float64) (*ticket, verdict, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	t := &ticket{cost: c, arrived: now}
	a.detect(now)
	if a.cfg.Disabled || a.count == 0 || (len(a.queue) == 0 && a.inflight+c <= a.budget) {
		a.start(t, now)
		return t, admitted, 0
	}
	if now.Before(a.overUntil) || a.queued+c > queueShare*a.budget {
		a.ivRefused += c
		return nil, refused, int(retryAfter / time.Second)
	}
	t.ready = make(chan struct{})
	a.queue = append(a.queue, t)
	a.queued += c
	return t, queued, 0
}

// cancel withdraws a queued request whose client left. It reports false
// when the request had already started: the caller then owes done.
func (a *admission) cancel(t *ticket) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t.started {
		return false
	}
	for i, q := range a.queue {
		if q == t {
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
			a.queued -= t.cost
			break
		}
	}
	a.dispatch(a.now()) // a large head leaving may let smaller ones start
	return true
}

// start counts t as running; the caller holds a.mu.
func (a *admission) start(t *ticket, now time.Time) {
	t.started, t.onIdle, t.wait = true, a.count == 0, now.Sub(t.arrived)
	a.inflight += t.cost
	a.count++
	a.seq++
	t.seq = a.seq
	a.ivStarted += t.cost
	if a.ivMin < 0 || t.wait < a.ivMin {
		a.ivMin = t.wait
	}
}

// dispatch starts queued requests, oldest first, while they fit (the
// oldest blocks the others: no overtaking by cheap requests).
func (a *admission) dispatch(now time.Time) {
	for len(a.queue) > 0 {
		t := a.queue[0]
		if a.count > 0 && a.inflight+t.cost > a.budget {
			return
		}
		a.queue[0] = nil
		a.queue = a.queue[1:]
		a.queued -= t.cost
		a.start(t, now)
		close(t.ready)
	}
	a.queued = 0 // no float drift when empty
}

// detect closes the detector's interval once it has lasted its length.
// It finds overload when a queue stood through the interval (every request
// that started in it waited longer than the target, or none started while
// the oldest waiter has) while the budget was at its latency limit (else
// the queue only waits for the budget to grow), or when the cost refused
// in it reached both the budget and the cost started in it (demand at
// least twice what runs; a refused client is counted once a Retry-After:
// the budget alone would be reached ever more easily as it shrinks).
// Overload
// lasts a Retry-After beyond the last such interval: refused clients come
// back only then, and only then show whether demand is still high.
func (a *admission) detect(now time.Time) {
	target, ok := a.target()
	if !ok {
		a.ivStart, a.ivMin, a.ivRefused, a.ivStarted, a.ivAtLimit = now, -1, 0, 0, false
		return
	}
	if now.Sub(a.ivStart) < intervalRatio*target {
		return
	}
	standing := a.ivAtLimit && (a.ivMin > target || (a.ivMin < 0 && len(a.queue) > 0 && now.Sub(a.queue[0].arrived) > target))
	if standing || a.ivRefused >= math.Max(a.budget, a.ivStarted) {
		a.overUntil = now.Add(retryAfter + intervalRatio*target)
	}
	a.ivStart, a.ivMin, a.ivRefused, a.ivStarted, a.ivAtLimit = now, -1, 0, 0, false
}

// target is the queueing-delay target; false while it is unknown (no
// configured one and no baseline yet).
func (a *admission) target() (time.Duration, bool) {
	if a.cfg.QueueTarget > 0 {
		return a.cfg.QueueTarget, true
	}
	base, ok := a.baseline()
	if !ok {
		return 0, false
	}
	return time.Duration(targetShare * base * requestSteps(couplet.Request{}) * float64(time.Second)), true
}

// done records a finished started request: its decode steps and its
// latency from start (0 = it never ran: not recorded), and starts queued
// requests that now fit.
func (a *admission) done(t *ticket, steps float64, latency time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	alone := t.onIdle && a.seq == t.seq // nobody started while it ran
	a.inflight -= t.cost
	a.count--
	if a.count == 0 {
		a.inflight = 0 // no float drift when idle
	}
	if latency > 0 && steps > 0 {
		a.adapt(t.cost, latency.Seconds()/steps, alone, now)
	}
	a.detect(now)
	a.dispatch(now)
}

// adapt feeds one finished request's per-step latency to the baseline and
// the budget; the caller holds a.mu.
func (a *admission) adapt(cost, per float64, alone bool, now time.Time) {
	if alone {
		if len(a.alone) < aloneSamples {
			a.alone = append(a.alone, per)
		} else {
			a.alone[a.aloneNext] = per
			a.aloneNext = (a.aloneNext + 1) % aloneSamples
		}
	}
	if a.ewma == 0 {
		a.ewma = per
	} else {
		a.ewma += ewmaAlpha * (per - a.ewma)
	}
	factor := a.cfg.LatencyFactor
	if now.Before(a.overUntil) {
		factor = a.cfg.OverloadFactor
	}
	base, known := a.baseline()
	a.ivAtLimit = a.ivAtLimit || (known && a.ewma > a.cfg.LatencyFactor*base)
	switch {
	case known && a.ewma > factor*base:
		if now.Sub(a.lastShrink) >= shrinkEvery {
			a.budget = math.Max(a.cfg.MinBudget, a.budget*shrinkFactor)
			a.lastShrink = now
		}
	case a.inflight+cost >= a.budget/2 || len(a.queue) > 0: // the budget was in use: probe upwards
		a.budget = math.Min(a.cfg.MaxBudget, a.budget+growPerFinish*cost)
	}
}

// baseline is the mean unloaded per-step latency; false until minAlone
// requests ran alone.
func (a *admission) baseline() (float64, bool) {
	if len(a.alone) < minAlone {
		return 0, false
	}
	sum := 0.0
	for _, x := range a.alone {
		sum += x
	}
	return sum / float64(len(a.alone)), true
}

// snapshot returns the budget and the cost in flight (tests).
func (a *admission) snapshot() (budget, inflight float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.budget, a.inflight
}

// admissionState is what /metrics reports of the controller; costs are in
// default-request units (n × steps ÷ defaultCost).
type admissionState struct {
	Budget, InFlight, Queued float64
	QueueLen                 int
	Overloaded               bool
}

func (a *admission) state() admissionState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return admissionState{
		Budget: a.budget / defaultCost, InFlight: a.inflight / defaultCost, Queued: a.queued / defaultCost,
		QueueLen: len(a.queue), Overloaded: a.now().Before(a.overUntil),
	}
}
