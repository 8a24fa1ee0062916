package server

import (
	"context"
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

// Within the budget everything is admitted; past it requests are refused
// with a Retry-After; finishing frees the budget.
func TestAdmissionBudget(t *testing.T) {
	a, _ := newTestAdmission(AdmissionConfig{InitialBudget: 4 * defaultCost})
	for i := 0; i < 4; i++ {
		if ok, _ := a.tryAdmit(defaultCost); !ok {
			t.Fatalf("request %d refused within the budget", i)
		}
	}
	ok, retry := a.tryAdmit(defaultCost)
	if ok || retry < 1 {
		t.Fatalf("past the budget: ok=%v retry=%d, want refused with Retry-After ≥ 1", ok, retry)
	}
	a.done(defaultCost, 22, 0)
	if ok, _ := a.tryAdmit(defaultCost); !ok {
		t.Error("refused after a request finished")
	}
}

// Cost-aware: one n=10, length-28 request takes the room of many default
// ones; but on an idle server even a request above the budget is admitted.
func TestAdmissionCostAware(t *testing.T) {
	a, _ := newTestAdmission(AdmissionConfig{InitialBudget: 8 * defaultCost})
	huge := requestCost(couplet.Request{N: 10, Length: 28})
	if ok, _ := a.tryAdmit(huge); !ok {
		t.Fatal("an idle server refused a large request")
	}
	if ok, _ := a.tryAdmit(defaultCost); ok {
		t.Error("a default request was admitted while a request above the whole budget runs")
	}
	a.done(huge, 64, 0)
	for i := 0; i < 8; i++ {
		if ok, _ := a.tryAdmit(defaultCost); !ok {
			t.Fatalf("default request %d refused", i)
		}
	}
	if ok, _ := a.tryAdmit(huge); ok {
		t.Error("a large request was admitted on top of a full budget")
	}
}

// Latency per step above LatencyFactor × baseline shrinks the budget (at
// most once per shrinkEvery); fast completions while the budget is in use
// grow it; fast completions on an idle budget do not.
func TestAdmissionAdapts(t *testing.T) {
	a, clk := newTestAdmission(AdmissionConfig{InitialBudget: 10 * defaultCost, LatencyFactor: 2})
	steps := requestSteps(couplet.Request{})
	fast := time.Duration(steps) * 10 * time.Millisecond // 10 ms a step: the baseline
	run := func(lat time.Duration) {
		if ok, _ := a.tryAdmit(defaultCost); !ok {
			t.Fatal("refused")
		}
		clk.advance(lat)
		a.done(defaultCost, steps, lat)
	}
	run(fast) // idle: sets the baseline, does not grow (budget unused)
	b0, _ := a.snapshot()
	if b0 != 10*defaultCost {
		t.Fatalf("budget %v after one request on an idle server, want unchanged %v", b0, 10*defaultCost)
	}
	// Slow completions (3× baseline): shrink once per shrinkEvery.
	run(3 * fast)
	b1, _ := a.snapshot()
	if b1 >= b0 {
		t.Fatalf("budget %v did not shrink after a slow completion (was %v)", b1, b0)
	}
	run(3 * fast / 2) // 1.5× baseline: within the factor, budget unused → unchanged
	if b, _ := a.snapshot(); b != b1 {
		t.Errorf("budget changed to %v on an unused budget", b)
	}
	a.tryAdmit(defaultCost) // a burst of slow completions within shrinkEvery: one shrink
	for i := 0; i < 2; i++ {
		a.tryAdmit(defaultCost)
	}
	clk.advance(shrinkEvery)
	for i := 0; i < 3; i++ {
		a.done(defaultCost, steps, 3*fast)
	}
	if b, _ := a.snapshot(); b != b1*shrinkFactor {
		t.Errorf("budget %v after a burst of slow completions, want one shrink to %v", b, b1*shrinkFactor)
	}
	// Fast completions with the budget in use grow it.
	b2, _ := a.snapshot()
	for a.inflight+defaultCost <= b2 {
		a.tryAdmit(defaultCost)
	}
	a.done(defaultCost, steps, fast)
	if b, _ := a.snapshot(); b <= b2 {
		t.Errorf("budget %v did not grow on a fast completion with the budget in use (was %v)", b, b2)
	}
}

// The baseline is a windowed minimum: a faster past is forgotten after two
// windows, so the budget recovers when the machine got slower for good.
func TestAdmissionBaselineWindow(t *testing.T) {
	a, clk := newTestAdmission(AdmissionConfig{Window: time.Minute})
	a.tryAdmit(1)
	a.done(1, 1, 10*time.Millisecond)
	clk.advance(time.Minute)
	a.tryAdmit(1)
	a.done(1, 1, 40*time.Millisecond)
	if got := a.baseline(); got != 0.010 {
		t.Errorf("baseline %v within two windows, want 0.010", got)
	}
	clk.advance(time.Minute)
	a.tryAdmit(1)
	a.done(1, 1, 40*time.Millisecond)
	if got := a.baseline(); got != 0.040 {
		t.Errorf("baseline %v after two windows, want 0.040", got)
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
