package server

import (
	"context"
	"math"
	"net/http"
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
func admitN(t *testing.T, a *admission, n int) []ticket {
	t.Helper()
	var ts []ticket
	for i := 0; i < n; i++ {
		tk, ok, _ := a.tryAdmit(defaultCost)
		if !ok {
			t.Fatalf("request %d refused", i)
		}
		ts = append(ts, tk)
	}
	return ts
}

// Within the budget everything is admitted; past it requests are refused
// with a Retry-After; finishing frees the budget.
func TestAdmissionBudget(t *testing.T) {
	a, _ := newTestAdmission(AdmissionConfig{InitialBudget: 4 * defaultCost})
	ts := admitN(t, a, 4)
	_, ok, retry := a.tryAdmit(defaultCost)
	if ok || retry < 1 {
		t.Fatalf("past the budget: ok=%v retry=%d, want refused with Retry-After ≥ 1", ok, retry)
	}
	a.done(ts[0], 22, 0)
	if _, ok, _ := a.tryAdmit(defaultCost); !ok {
		t.Error("refused after a request finished")
	}
}

// Cost-aware: one n=10, length-28 request takes the room of many default
// ones; but on an idle server even a request above the budget is admitted.
func TestAdmissionCostAware(t *testing.T) {
	a, _ := newTestAdmission(AdmissionConfig{InitialBudget: 8 * defaultCost})
	huge := requestCost(couplet.Request{N: 10, Length: 28})
	tk, ok, _ := a.tryAdmit(huge)
	if !ok {
		t.Fatal("an idle server refused a large request")
	}
	if _, ok, _ := a.tryAdmit(defaultCost); ok {
		t.Error("a default request was admitted while a request above the whole budget runs")
	}
	a.done(tk, 64, 0)
	admitN(t, a, 8)
	if _, ok, _ := a.tryAdmit(huge); ok {
		t.Error("a large request was admitted on top of a full budget")
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
	var ts []ticket
	for {
		tk, ok, _ := a.tryAdmit(defaultCost)
		if !ok {
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

// postNoT posts from a goroutine that must not call t.Fatal.
func postNoT(url, body string) (int, http.Header, error) {
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	res.Body.Close()
	return res.StatusCode, res.Header, nil
}
