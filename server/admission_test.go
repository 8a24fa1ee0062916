package server

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"chunlian/couplet"
)

// fakeClock is a manual clock for the admission controller.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestAdmission(cfg AdmissionConfig) (*admission, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	return newAdmission(cfg, clk.now), clk
}

func TestRequestCost(t *testing.T) {
	base := requestCost(couplet.Request{N: 1})
	big := requestCost(couplet.Request{N: 10, Length: 28})
	// n × steps: ten 28-character candidates are ~40 default requests
	if want := 10 * float64(2*28+8) / float64(2*7+8) * base; big != want {
		t.Errorf("cost(n=10, length 28) = %v, want %v", big, want)
	}
	if lower := requestCost(couplet.Request{N: 2, Mode: couplet.ModeLower, Text: "春回大地千山秀"}); lower != 2*base {
		t.Errorf("lower mode with a 7-character 上联, n=2: cost %v, want %v", lower, 2*base)
	}
}

// admitN admits n default requests and returns their tickets; it fails
// the test if one is refused.
func admitN(t *testing.T, a *admission, n int) []*ticket {
	t.Helper()
	var ts []*ticket
	for i := 0; i < n; i++ {
		tk, v, _ := a.tryAdmit(defaultCost)
		if v != admitted {
			t.Fatalf("request %d not started at once (verdict %d)", i, v)
		}
		ts = append(ts, tk)
	}
	return ts
}

// Within the budget everything starts at once; past it a request waits in
// the queue while its cost fits queueShare of the budget, and is refused
// with a Retry-After beyond; finishing starts the oldest waiter.
func TestAdmissionBudget(t *testing.T) {
	a, _ := newTestAdmission(AdmissionConfig{InitialBudget: 4 * defaultCost})
	ts := admitN(t, a, 4)
	var ws []*ticket
	for range int(queueShare * 4) {
		w, v, _ := a.tryAdmit(defaultCost)
		if v != queued {
			t.Fatalf("past the budget, queue of %d: verdict %d, want queued", len(ws), v)
		}
		ws = append(ws, w)
	}
	if _, v, retry := a.tryAdmit(defaultCost); v != refused || retry < 1 {
		t.Fatalf("past the budget and the queue: verdict %d retry=%d, want refused with Retry-After ≥ 1", v, retry)
	}
	a.done(ts[0], 22, 0)
	select {
	case <-ws[0].ready:
	default:
		t.Fatal("the oldest queued request did not start when a request finished")
	}
	if ws[1].started {
		t.Fatal("two queued requests started when one request finished")
	}
	if _, v, _ := a.tryAdmit(defaultCost); v != queued {
		t.Errorf("verdict %d with a place free in the queue again, want queued", v)
	}
}

// A queued request whose client leaves gives its place up; one that had
// already started must be finished by the caller.
func TestAdmissionCancel(t *testing.T) {
	a, _ := newTestAdmission(AdmissionConfig{InitialBudget: 8 * defaultCost})
	ts := admitN(t, a, 8)
	w, v, _ := a.tryAdmit(defaultCost)
	if v != queued || !a.cancel(w) {
		t.Fatalf("verdict %d; a queued request could not be withdrawn", v)
	}
	a.done(ts[0], 22, 0)
	if w.started {
		t.Fatal("a withdrawn request started")
	}
	w2, v, _ := a.tryAdmit(2 * defaultCost) // does not fit next to seven: queued
	if v != queued {
		t.Fatalf("verdict %d, want queued", v)
	}
	a.done(ts[1], 22, 0)
	if a.cancel(w2) {
		t.Error("cancel took back a request that had started")
	}
	if _, inflight := a.snapshot(); inflight != 8*defaultCost {
		t.Errorf("in flight %v, want six requests and the started one of double cost, %v", inflight, 8*defaultCost)
	}
}

// Cost-aware: one n=10, length-28 request takes the room of many default
// ones; but on an idle server even a request above the budget is admitted.
func TestAdmissionCostAware(t *testing.T) {
	a, _ := newTestAdmission(AdmissionConfig{InitialBudget: 8 * defaultCost})
	huge := requestCost(couplet.Request{N: 10, Length: 28})
	tk, v, _ := a.tryAdmit(huge)
	if v != admitted {
		t.Fatal("an idle server did not start a large request at once")
	}
	w, v, _ := a.tryAdmit(defaultCost)
	if v != queued {
		t.Errorf("a default request while a request above the whole budget runs: verdict %d, want queued", v)
	}
	a.done(tk, 64, 0)
	if v == queued && !w.started {
		t.Error("the queued request did not start when the large one finished")
	}
	admitN(t, a, 7)
	if _, v, _ := a.tryAdmit(huge); v != refused {
		t.Errorf("a large request on top of a full budget: verdict %d, want refused (its cost is over the queue's bound)", v)
	}
}

// The baseline is the mean per-step latency of requests that ran alone:
// requests that overlapped another do not count. Before minAlone such
// requests there is no baseline.
func TestAdmissionBaseline(t *testing.T) {
	a, _ := newTestAdmission(AdmissionConfig{})
	alone := func(per time.Duration) {
		tk, _, _ := a.tryAdmit(1)
		a.done(tk, 1, per)
	}
	alone(10 * time.Millisecond)
	alone(10 * time.Millisecond)
	if _, known := a.baseline(); known {
		t.Fatal("a baseline after two samples")
	}
	// Two overlapping requests: neither ran alone.
	t1, _, _ := a.tryAdmit(1)
	t2, _, _ := a.tryAdmit(1)
	a.done(t1, 1, 500*time.Millisecond)
	a.done(t2, 1, 500*time.Millisecond)
	if _, known := a.baseline(); known {
		t.Fatal("overlapping requests counted as unloaded")
	}
	alone(40 * time.Millisecond)
	if base, known := a.baseline(); !known || math.Abs(base-0.020) > 1e-12 {
		t.Errorf("baseline %v (known %v), want the mean 0.020", base, known)
	}
}

// With a baseline, smoothed per-step latency above LatencyFactor × baseline
// shrinks the budget, at most once per shrinkEvery; fast completions while
// the budget is in use grow it; without a baseline nothing shrinks.
func TestAdmissionAdapts(t *testing.T) {
	a, clk := newTestAdmission(AdmissionConfig{InitialBudget: 10 * defaultCost, LatencyFactor: 2})
	steps := requestSteps(couplet.Request{})
	fast := time.Duration(steps) * 10 * time.Millisecond // 10 ms a step
	slow := 4 * fast
	budget := func() float64 { b, _ := a.snapshot(); return b }
	// No baseline yet: slow completions under load do not shrink.
	for _, tk := range admitN(t, a, 4) {
		clk.advance(shrinkEvery)
		a.done(tk, steps, slow)
	}
	if b := budget(); b < 10*defaultCost {
		t.Fatalf("budget shrank to %v without a baseline", b)
	}
	a.ewma = 0
	for i := 0; i < minAlone; i++ { // the unloaded speed: 10 ms a step
		tk := admitN(t, a, 1)[0]
		a.done(tk, steps, fast)
	}
	b0 := budget()
	// A burst of slow completions within shrinkEvery: one shrink.
	clk.advance(shrinkEvery)
	for _, tk := range admitN(t, a, 3) {
		a.done(tk, steps, slow)
	}
	if b := budget(); b != b0*shrinkFactor {
		t.Fatalf("budget %v after a burst of slow completions, want one shrink to %v", b, b0*shrinkFactor)
	}
	// Still slow after shrinkEvery: another shrink (two overlapping
	// requests, so the slow ones are not taken for the unloaded speed).
	clk.advance(shrinkEvery)
	for _, tk := range admitN(t, a, 2) {
		a.done(tk, steps, slow)
	}
	if b := budget(); b != b0*shrinkFactor*shrinkFactor {
		t.Fatalf("budget %v, want a second shrink to %v", b, b0*shrinkFactor*shrinkFactor)
	}
	// Fast again, with the budget in use: once the smoothed latency is
	// back under the factor the budget grows.
	b1 := budget()
	var ts []*ticket
	for {
		tk, v, _ := a.tryAdmit(defaultCost)
		if v != admitted {
			if v == queued {
				a.cancel(tk)
			}
			break
		}
		ts = append(ts, tk)
	}
	for _, tk := range ts {
		a.done(tk, steps, fast)
	}
	if b := budget(); b <= b1 {
		t.Errorf("budget %v did not grow on fast completions with the budget in use (was %v)", b, b1)
	}
}

// Through the HTTP layer: with the budget full, a request is refused with
// 503 overloaded and Retry-After at once.
func TestAdmissionHTTP(t *testing.T) {
	block := make(chan struct{})
	started := make(chan struct{}, 1)
	srv, base := newFakeServer(t, Config{Admission: AdmissionConfig{InitialBudget: defaultCost, MinBudget: defaultCost}}, nil)
	srv.Attach(Backend{Generator: fakeGen{func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		started <- struct{}{}
		<-block
		return []couplet.Couplet{fakeCouplet}, nil
	}}, ModelName: "fake"})
	done := make(chan int)
	go func() {
		code, _, _ := postNoT(base+"/generate", `{"prompt":"平安"}`)
		done <- code
	}()
	<-started
	code, h, body := post(t, base+"/generate", `{"prompt":"平安"}`)
	if code != 503 || h.Get("Retry-After") == "" {
		t.Errorf("over the budget: %d Retry-After %q", code, h.Get("Retry-After"))
	}
	checkError(t, body, codeOverloaded)
	close(block)
	if c := <-done; c != 200 {
		t.Errorf("admitted request: %d", c)
	}
}

// Through the HTTP layer: past the budget a request waits and starts when
// a running one finishes; a waiting request whose client leaves gives its
// place and its in-flight slot back.
func TestAdmissionHTTPQueue(t *testing.T) {
	block := make(chan struct{})
	started := make(chan struct{}, 4)
	two := 2 * defaultCost
	srv, base := newFakeServer(t, Config{Admission: AdmissionConfig{InitialBudget: two, MinBudget: two, MaxBudget: two}}, nil)
	srv.Attach(Backend{Generator: fakeGen{func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		started <- struct{}{}
		<-block
		return []couplet.Couplet{fakeCouplet}, nil
	}}, ModelName: "fake"})
	codes := make(chan int, 4)
	send := func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/generate", strings.NewReader(`{"prompt":"平安"}`))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			codes <- 0
			return
		}
		res.Body.Close()
		codes <- res.StatusCode
	}
	// waitFor polls the server's state (no timing is asserted: the bound
	// only turns a hang into a failure).
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("never: %s", what)
			}
		}
	}
	waitQueued := func(n int) {
		t.Helper()
		waitFor(fmt.Sprintf("%d requests queued", n), func() bool {
			srv.adm.mu.Lock()
			defer srv.adm.mu.Unlock()
			return len(srv.adm.queue) == n
		})
	}
	go send(context.Background())
	go send(context.Background())
	<-started
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	go send(ctx)
	waitQueued(1)
	cancel()
	if c := <-codes; c != 0 {
		t.Fatalf("the cancelled request got %d", c)
	}
	waitQueued(0)
	waitFor("the waiting request's in-flight slot given back", func() bool { return len(srv.inflight) == 2 })
	go send(context.Background())
	waitQueued(1)
	rec := httptest.NewRecorder()
	srv.metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{"chunlian:admission_queue_length 1\n", "chunlian:admission_overloaded 0\n"} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %q while one request waits", strings.TrimSpace(want))
		}
	}
	if st := srv.adm.state(); st.InFlight <= 0 || st.Queued <= 0 || st.Budget < st.InFlight {
		t.Errorf("admission state while one request waits: %+v", st)
	}
	block <- struct{}{} // one running request finishes: the waiting one starts
	<-started
	close(block)
	for range 3 {
		if c := <-codes; c != 200 {
			t.Errorf("a started or queued request got %d, want 200", c)
		}
	}
	waitFor("no cost in flight once all finished", func() bool { _, c := srv.adm.snapshot(); return c == 0 })
}

// postNoT posts from a goroutine that must not call t.Fatal.
func postNoT(url, body string) (int, http.Header, error) {
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	res.Body.Close()
	return res.StatusCode, res.Header, nil
}

// simEngine is a deterministic model of the engine behind admission, on a
// fake clock: continuous batching, one decode step at a time for every
// running request, a step taking simStep × (1 + b/simBatch) for b running
// requests (batching raises a step's latency: ×4.3 at ten, as on the
// 2-core CPU with three samples per couplet, where a step at ten users
// takes about 4.6 times an unloaded one), and a stalled step now and then
// (another process taking the cores: simStall of the steps last simStallX
// as long). Users are closed
// loop: send, wait for the answer, send again; a refused user waits the
// Retry-After.
type simEngine struct {
	a     *admission
	clk   *fakeClock
	rng   *rand.Rand
	steps float64    // decode steps of a default request
	us    []*simUser // users of all runs so far: a run's users carry on into the next
	// busy, when > 1, slows every step by that much during the first
	// second of every four (other processes on the machine).
	busy float64
}

const (
	simStep   = 2 * time.Millisecond
	simStall  = 0.02
	simStallX = 10
	simBatch  = 3
)

type simUser struct {
	wake    time.Time // idle until then
	arrived time.Time
	tk      *ticket // waiting or running request; nil = idle
	left    int     // decode steps left once started
	running bool
	active  bool // sends requests (else it only finishes the one it has)
}

// simResult counts what a simulated run measured after its warm-up.
type simResult struct {
	ok, refused int
	lat, wait   []time.Duration // accepted requests: arrival → finish, arrival → start
}

func (r simResult) p99(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[(len(s)*99)/100]
}

func newSim(cfg AdmissionConfig) *simEngine {
	a, clk := newTestAdmission(cfg)
	return &simEngine{a: a, clk: clk, rng: rand.New(rand.NewPCG(1, 2)), steps: requestSteps(couplet.Request{})}
}

// run simulates users for warm + dur and reports the requests that
// arrived after warm.
func (e *simEngine) run(users int, warm, dur time.Duration) simResult {
	var res simResult
	for len(e.us) < users {
		e.us = append(e.us, &simUser{wake: e.clk.now()})
	}
	for i, u := range e.us {
		u.active = i < users
	}
	us := e.us
	from, end := e.clk.now().Add(warm), e.clk.now().Add(warm+dur)
	for e.clk.now().Before(end) {
		now := e.clk.now()
		b, next := 0, end
		for _, u := range us {
			if u.active && u.tk == nil && !u.wake.After(now) {
				tk, v, retry := e.a.tryAdmit(defaultCost)
				if v == refused {
					u.wake = now.Add(time.Duration(retry) * time.Second)
					if !now.Before(from) {
						res.refused++
					}
				} else {
					u.tk, u.arrived, u.left, u.running = tk, now, int(e.steps), false
				}
			}
			if u.tk != nil && u.tk.started {
				u.running = true
				b++
			} else if u.active && u.tk == nil && u.wake.Before(next) {
				next = u.wake
			}
		}
		if b == 0 { // idle: on to the next user's wake-up
			e.clk.advance(next.Sub(now))
			continue
		}
		d := time.Duration(float64(simStep) * (1 + float64(b)/simBatch))
		if e.rng.Float64() < simStall {
			d *= simStallX
		}
		if e.busy > 1 && now.Sub(time.Unix(0, 0))%(4*time.Second) < time.Second {
			d = time.Duration(float64(d) * e.busy)
		}
		e.clk.advance(d)
		for _, u := range us {
			if !u.running {
				continue
			}
			if u.left--; u.left > 0 {
				continue
			}
			tk := u.tk
			started := u.arrived.Add(tk.wait)
			e.a.done(tk, e.steps, e.clk.now().Sub(started))
			if !u.arrived.Before(from) {
				res.ok++
				res.lat = append(res.lat, e.clk.now().Sub(u.arrived))
				res.wait = append(res.wait, tk.wait)
			}
			u.tk, u.running, u.wake = nil, false, e.clk.now()
		}
	}
	return res
}

// unloaded runs one user first, so that the controller knows the
// unloaded speed, and returns that run.
func (e *simEngine) unloaded() simResult { return e.run(1, time.Second, 20*time.Second) }

// Load well under capacity (ten users, where the CPU gives full
// throughput) is never refused, on a quiet machine and on one where other
// processes halve the speed one second in four, and keeps the throughput
// of no admission at all.
func TestAdmissionSimUnderCapacity(t *testing.T) {
	for _, busy := range []float64{1, 2} {
		free := newSim(AdmissionConfig{Disabled: true})
		free.busy = busy
		free.unloaded()
		want := free.run(10, 0, 60*time.Second)
		e := newSim(AdmissionConfig{})
		e.busy = busy
		e.unloaded()
		got := e.run(10, 0, 60*time.Second)
		t.Logf("busy %v, 10 users: %d ok, %d refused, p99 %v, p99 wait %v (no admission: %d ok, p99 %v)",
			busy, got.ok, got.refused, got.p99(got.lat), got.p99(got.wait), want.ok, want.p99(want.lat))
		if got.refused > 0 {
			t.Errorf("busy %v: %d requests refused at ten users", busy, got.refused)
		}
		if float64(got.ok) < 0.97*float64(want.ok) {
			t.Errorf("busy %v: %d requests served, want at least 97%% of the %d without admission", busy, got.ok, want.ok)
		}
	}
}

// At 20 times that load the excess is refused, and accepted requests keep
// p99 ≤ 2 × the unloaded p99 (the service's goal), with a queueing delay
// bounded by a fraction of an unloaded request.
func TestAdmissionSimOverload(t *testing.T) {
	e := newSim(AdmissionConfig{})
	one := e.unloaded()
	got := e.run(200, 2*time.Second, 60*time.Second)
	unloaded := one.p99(one.lat)
	t.Logf("1 user: %d ok, p99 %v; 200 users: %d ok, %d refused, p99 %v, p99 wait %v, max wait %v",
		one.ok, unloaded, got.ok, got.refused, got.p99(got.lat), got.p99(got.wait), slices.Max(got.wait))
	if got.refused == 0 {
		t.Fatal("nothing refused at 200 users")
	}
	if p := got.p99(got.lat); p > 2*unloaded {
		t.Errorf("accepted p99 %v, want ≤ 2 × the unloaded p99 %v", p, unloaded)
	}
	if w := slices.Max(got.wait); w > unloaded/2 {
		t.Errorf("longest queueing delay %v, want ≤ half the unloaded p99 %v", w, unloaded)
	}
}
