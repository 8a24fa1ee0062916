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
// of one (two lines of the requested length, the 横批 and the prompt).
// Admission keeps the summed cost of admitted, unfinished requests under a
// budget; a request that does not fit is refused at once with 503 and
// Retry-After instead of queueing behind work that would make everybody
// slow. The budget adapts, AIMD-style, to the latency each finished request
// saw per decode step (its latency divided by its steps: queueing in the
// engine and bigger batches both raise it): while that stays within
// LatencyFactor × the baseline (the lowest per-step latency seen in the
// recent window, i.e. the unloaded speed) and the budget is in use, the
// budget grows additively; when it exceeds it, the budget shrinks
// multiplicatively (at most once per shrinkEvery, so one burst of slow
// completions does not collapse it). So the service runs near the knee of
// its latency curve whatever the machine, the model or the request mix,
// and accepted requests keep a latency near LatencyFactor × unloaded.
//
// One request is always admitted when nothing is in flight, whatever its
// cost, so a single large request is never refused on an idle server.

// AdmissionConfig tunes admission; zero values mean the defaults.
type AdmissionConfig struct {
	// LatencyFactor is the per-step latency, relative to the unloaded
	// baseline, above which the budget shrinks (default 1.6: the issue's
	// goal is accepted p99 ≤ 2 × unloaded p99, with headroom for the
	// budget's own overshoot).
	LatencyFactor float64
	// InitialBudget is the budget at start, in cost units (default 8
	// default-sized requests); MinBudget the floor (default 1 request).
	InitialBudget, MinBudget float64
	// MaxBudget caps the budget (default 1024 default-sized requests).
	MaxBudget float64
	// Window is how long a baseline (lowest per-step latency) is
	// remembered (default 60s): a slower machine state (thermal, a
	// neighbour) raises it after a window, so the budget does not shrink
	// forever against a speed that is gone.
	Window time.Duration
	// Disabled turns adaptive admission off (only MaxInFlight applies).
	Disabled bool
}

const (
	shrinkEvery   = 200 * time.Millisecond
	shrinkFactor  = 0.8
	growPerFinish = 0.25 // of the finished request's cost, per good completion
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
	cfg      AdmissionConfig
	now      func() time.Time
	mu       sync.Mutex
	budget   float64
	inflight float64 // summed cost of admitted, unfinished requests
	count    int     // admitted, unfinished requests
	// baseline: two-bucket windowed minimum of per-step latency (seconds)
	minCur, minPrev float64
	bucketStart     time.Time
	lastShrink      time.Time
}

func newAdmission(cfg AdmissionConfig, now func() time.Time) *admission {
	if cfg.LatencyFactor == 0 {
		cfg.LatencyFactor = 1.6
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
	if cfg.Window == 0 {
		cfg.Window = time.Minute
	}
	if now == nil {
		now = time.Now
	}
	return &admission{cfg: cfg, now: now, budget: cfg.InitialBudget,
		minCur: math.Inf(1), minPrev: math.Inf(1), bucketStart: now()}
}

// tryAdmit admits a request of cost c, or reports false with the seconds
// a client should wait before retrying (Retry-After).
func (a *admission) tryAdmit(c float64) (ok bool, retryAfter int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cfg.Disabled || a.count == 0 || a.inflight+c <= a.budget {
		a.inflight += c
		a.count++
		return true, 0
	}
	// Work drains within about one unloaded request time; a second is
	// the smallest Retry-After.
	return false, 1
}

// done records a finished admitted request: its cost, its decode steps
// and its latency. Failed requests are recorded too (their time was
// spent), except when latency is 0 (never ran).
func (a *admission) done(c, steps float64, latency time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight -= c
	a.count--
	if a.count == 0 {
		a.inflight = 0 // no float drift when idle
	}
	if latency <= 0 || steps <= 0 {
		return
	}
	now := a.now()
	if now.Sub(a.bucketStart) >= a.cfg.Window {
		a.minPrev, a.minCur, a.bucketStart = a.minCur, math.Inf(1), now
	}
	per := latency.Seconds() / steps
	if per < a.minCur {
		a.minCur = per
	}
	base := a.baseline()
	switch {
	case per > a.cfg.LatencyFactor*base:
		if now.Sub(a.lastShrink) >= shrinkEvery {
			a.budget = math.Max(a.cfg.MinBudget, a.budget*shrinkFactor)
			a.lastShrink = now
		}
	case a.inflight+c >= a.budget/2: // the budget was in use: probe upwards
		a.budget = math.Min(a.cfg.MaxBudget, a.budget+growPerFinish*c)
	}
}

func (a *admission) baseline() float64 { return math.Min(a.minCur, a.minPrev) }

// snapshot returns the budget and the cost in flight (metrics, tests).
func (a *admission) snapshot() (budget, inflight float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.budget, a.inflight
}
