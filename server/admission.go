package server

import (
	"math"
	"sync"
	"time"
	"unicode/utf8"

	"chunlian/couplet"
)

// Adaptive, cost-aware admission.
//
// A request's cost is the work it asks for: n candidates × the decode steps
// of one (two lines of the requested length and the 横批). Admission keeps
// the summed cost of admitted, unfinished requests under a budget; a
// request that does not fit is refused at once with 503 and Retry-After
// instead of queueing behind work that would make everybody slow. The
// budget adapts, AIMD-style, to the latency per decode step that finished
// requests saw (latency / steps: queueing in the engine and bigger batches
// both raise it), smoothed (EWMA), against the unloaded per-step latency:
// the mean over the last requests that ran alone (admitted on an idle
// server, nobody admitted while they ran). While the smoothed latency stays
// within LatencyFactor × that and the budget is in use, the budget grows
// additively; above it, it shrinks multiplicatively (at most once per
// shrinkEvery). Means and smoothing matter: on a shared or noisy machine
// single requests vary by several times (p99/p50 ≈ 3.5 unloaded on the
// shared 2-core box), and a minimum-based baseline shed nearly everything;
// the mean carries that spread into the baseline. So the service runs near the knee of its latency
// curve whatever the machine, the model or the request mix, and accepted
// requests keep a latency near LatencyFactor × unloaded.
//
// One request is always admitted when nothing is in flight, whatever its
// cost, so a single large request is never refused on an idle server.

// AdmissionConfig tunes admission; zero values mean the defaults.
type AdmissionConfig struct {
	// LatencyFactor is the smoothed per-step latency, relative to the
	// unloaded mean, above which the budget shrinks (default 3: batching
	// alone doubles a step's latency at ten users on two cores, so 2 shed
	// load below the knee; docs/DECISIONS.md has the measurements).
	LatencyFactor float64
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
	minAlone      = 3    // before that many, the budget never shrinks
	ewmaAlpha     = 0.25 // weight of the newest per-step latency
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
	inflight   float64   // summed cost of admitted, unfinished requests
	count      int       // admitted, unfinished requests
	seq        uint64    // admissions so far
	alone      []float64 // ring of unloaded per-step latencies (seconds)
	aloneNext  int
	ewma       float64 // smoothed per-step latency of all finished requests; 0 = none yet
	lastShrink time.Time
}

// ticket is one admitted request's record, returned to done.
type ticket struct {
	cost   float64
	seq    uint64 // a.seq after this admission
	onIdle bool   // admitted on an idle server
}

func newAdmission(cfg AdmissionConfig, now func() time.Time) *admission {
	if cfg.LatencyFactor == 0 {
		cfg.LatencyFactor = 3
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
	return &admission{cfg: cfg, now: now, budget: cfg.InitialBudget}
}

// tryAdmit admits a request of cost c, or reports false with the seconds
// a client should wait before retrying (Retry-After).
func (a *admission) tryAdmit(c float64) (t ticket, ok bool, retryAfter int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cfg.Disabled || a.count == 0 || a.inflight+c <= a.budget {
		t = ticket{cost: c, onIdle: a.count == 0}
		a.inflight += c
		a.count++
		a.seq++
		t.seq = a.seq
		return t, true, 0
	}
	// Work drains within about one unloaded request time; a second is
	// the smallest Retry-After.
	return ticket{}, false, 1
}

// done records a finished admitted request: its decode steps and its
// latency (0 = it never ran: not recorded).
func (a *admission) done(t ticket, steps float64, latency time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	alone := t.onIdle && a.seq == t.seq // nobody was admitted while it ran
	a.inflight -= t.cost
	a.count--
	if a.count == 0 {
		a.inflight = 0 // no float drift when idle
	}
	if latency <= 0 || steps <= 0 {
		return
	}
	per := latency.Seconds() / steps
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
	now := a.now()
	base, known := a.baseline()
	switch {
	case known && a.ewma > a.cfg.LatencyFactor*base:
		if now.Sub(a.lastShrink) >= shrinkEvery {
			a.budget = math.Max(a.cfg.MinBudget, a.budget*shrinkFactor)
			a.lastShrink = now
		}
	case a.inflight+t.cost >= a.budget/2: // the budget was in use: probe upwards
		a.budget = math.Min(a.cfg.MaxBudget, a.budget+growPerFinish*t.cost)
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

// snapshot returns the budget and the cost in flight (metrics, tests).
func (a *admission) snapshot() (budget, inflight float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.budget, a.inflight
}
