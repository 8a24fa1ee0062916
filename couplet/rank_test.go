package couplet

import (
	"context"
	"math"
	"sync"
	"testing"

	"chunlian/engine"
)

func TestParallelismAndDiversity(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()})
	ids := func(s string) []int32 { return charIDs(t, g, s) }
	p, err := g.t.prepare(Request{Text: "平安"}, DefaultTemperature)
	if err != nil {
		t.Fatal(err)
	}
	// At the rhythm positions (2, 4, 6 and the end) the classic couplet's
	// lines oppose and its 上联 alternates 平/仄; the flat one never does.
	for _, c := range []struct {
		u, l     string
		min, max float64
	}{
		{"天增岁月人增寿", "春满乾坤福满门", 1, 1}, // 增平 月仄 增平 寿仄 / 满仄 坤平 满仄 门平
		{"天天天天天天寿", "春春春春春春门", 0, 0.5},
	} {
		var u, l []int32
		u, l = ids(c.u), ids(c.l)
		got := parallelism(g.t, p, u, l)
		if got < c.min || got > c.max {
			t.Errorf("parallelism(%s, %s) = %.2f, want in [%.2f, %.2f]", c.u, c.l, got, c.min, c.max)
		}
	}

	mk := func(u, l string, score float64) *candidate { return testCandidate(t, g, u, l, score) }
	a := mk("春风暖日平安", "瑞雪迎新富贵", 1.0)
	a2 := mk("春风暖日平福", "瑞雪迎新富年", 0.95) // near-duplicate of a
	b := mk("天地人和喜庆", "山河日月吉祥", 0.9)
	got := selectDiverse([]*candidate{a, a2, b}, 2)
	if len(got) != 2 || got[0] != a || got[1] != b {
		t.Errorf("selectDiverse picked %v, %v; want the best and the dissimilar one", got[0].c.Upper, got[1].c.Upper)
	}
	if got := selectDiverse([]*candidate{a, a2, b}, 5); len(got) != 3 {
		t.Errorf("selectDiverse returned %d of 3", len(got))
	}
}

// testCandidate is a ranked candidate with lines u, l whose score and
// selection key are score.
func testCandidate(t *testing.T, g *Generator, u, l string, score float64) *candidate {
	t.Helper()
	c := &candidate{upperIDs: charIDs(t, g, u), lowerIDs: charIDs(t, g, l)}
	c.c.Score, c.key = score, score
	c.c.Upper, c.c.Lower = u, l
	return c
}

// tempEngine records the temperature of every generating request.
type tempEngine struct {
	*fakeEngine
	mu    sync.Mutex
	temps []float32
}

func (e *tempEngine) Generate(ctx context.Context, req *engine.Request) (*engine.Result, error) {
	if req.Params.MaxTokens > 0 {
		e.mu.Lock()
		e.temps = append(e.temps, req.Params.Temperature)
		e.mu.Unlock()
	}
	return e.fakeEngine.Generate(ctx, req)
}

// WithTemperature is the temperature of requests that leave it unset; a
// request's own temperature wins.
func TestWithTemperature(t *testing.T) {
	for _, tc := range []struct {
		set  float64 // the request's temperature (-1: unset)
		want float32
	}{{-1, 0.5}, {0.9, 0.9}} {
		rec := &tempEngine{fakeEngine: &fakeEngine{vocab: testModel.Tok.Size()}}
		g, err := New(testModel, rec, WithTemperature(0.5), WithBannerSources(testBannerSources()...))
		if err != nil {
			t.Fatal(err)
		}
		req := Request{Text: "平安", Seed: 3}
		if tc.set >= 0 {
			req.SetTemperature(tc.set)
		}
		if _, err := g.Generate(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if len(rec.temps) == 0 {
			t.Fatal("no generating request reached the engine")
		}
		for _, got := range rec.temps {
			if got != tc.want {
				t.Errorf("request temperature %v: engine got %v, want %v", tc.set, got, tc.want)
				break
			}
		}
	}
}

// allJudge is a Judge that finds every text unsuitable (bad) or none.
type allJudge struct{ bad bool }

func (allJudge) Parallelism(upper, lower string) float64 { return 0.5 }
func (allJudge) Festive(string) float64                  { return 0 }
func (allJudge) OpensWord(string) bool                   { return true }
func (allJudge) Taboo(string) []string                   { return nil }
func (j allJudge) Unsuitable(string) []string {
	if j.bad {
		return []string{"x"}
	}
	return nil
}

// TestCleanRound: when no candidate of the first round is clean of
// unsuitable words, one more round is drawn (and no more), and the
// couplet is still returned; a clean first round draws none.
func TestCleanRound(t *testing.T) {
	for _, c := range []struct {
		bad        bool
		temp       float64
		wantRounds int
	}{
		{false, 0.8, 1},
		{true, 0.8, 1 + cleanRounds},
		{true, 0, 1}, // greedy: a new round repeats itself
	} {
		fe := &fakeEngine{vocab: testModel.Tok.Size()}
		g := newFakeGen(t, fe, WithJudge(allJudge{c.bad}))
		req := Request{Text: "吉祥", N: 1, Seed: 5}
		req.SetTemperature(c.temp)
		cs, err := g.Generate(context.Background(), req)
		if err != nil || len(cs) != 1 {
			t.Fatalf("%+v: %v, %v", c, cs, err)
		}
		// One engine request per round, then at most one for the 横批.
		if got := fe.genCalls - fe.bannerCalls; got != c.wantRounds || fe.bannerCalls > 1 {
			t.Errorf("%+v: %d rounds, want %d", c, got, c.wantRounds)
		}
	}
}

func TestRecentServed(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()})
	mk := func(u, l string, score float64) *candidate { return testCandidate(t, g, u, l, score) }
	pick := func(r *recentServed, cs ...*candidate) string {
		for _, c := range cs {
			c.key = c.c.Score
		}
		r.demote("k", cs)
		return selectDiverse(cs, 1)[0].c.Upper
	}
	a := mk("春风暖日平安", "瑞雪迎新富贵", -1.0)
	b := mk("天地人和喜庆", "山河日月吉祥", -1.0-recentMargin+0.01)
	c := mk("花开富贵满堂", "竹报平安入户", -1.0-recentMargin-0.01)

	r := newRecentServed(2, 2)
	if got := pick(r, a, b); got != a.c.Upper {
		t.Fatalf("nothing served yet: picked %s, want the best", got)
	}
	r.add("k", []Couplet{a.c})
	if got := pick(r, a, b); got != b.c.Upper {
		t.Errorf("best served recently, the next within the margin: picked %s, want %s", got, b.c.Upper)
	}
	if got := pick(r, a, c); got != a.c.Upper {
		t.Errorf("the only fresh candidate ranks beyond the margin: picked %s, want the repeat %s", got, a.c.Upper)
	}
	r.add("k", []Couplet{b.c, c.c}) // window 2: a is forgotten
	if got := pick(r, a, b); got != a.c.Upper {
		t.Errorf("after the window passed: picked %s, want %s again", got, a.c.Upper)
	}
	r.add("k2", []Couplet{a.c})
	r.add("k3", []Couplet{a.c}) // limit 2 words: k is forgotten
	if _, ok := r.served["k"]; ok || len(r.served) != 2 || len(r.order) != 2 {
		t.Errorf("after a third word: %d words remembered (%v), want k forgotten", len(r.served), r.order)
	}
}

// TestRecentWindowInGenerate: unseeded requests for one word repeat a
// recently served couplet only when no fresh candidate ranks within the
// margin; seeded requests repeat themselves.
func TestRecentWindowInGenerate(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()}, WithOversample(4))
	var served []string
	avoided := 0
	for i := 0; i < 48; i++ {
		tr := &Trace{Explain: true}
		out, err := g.Generate(context.Background(), Request{Text: "平安", N: 1, Trace: tr, Temperature: 0.2})
		if err != nil {
			t.Fatal(err)
		}
		got := out[0].Upper + "|" + out[0].Lower
		recent := map[string]bool{}
		for _, s := range served[max(0, len(served)-DefaultRecentWindow):] {
			recent[s] = true
		}
		best := math.Inf(-1)
		for _, c := range tr.Candidates {
			best = max(best, c.Score)
		}
		fresh := false
		for _, c := range tr.Candidates {
			k := c.Upper + "|" + c.Lower
			fresh = fresh || !recent[k] && c.Score >= best-recentMargin
			if recent[k] && c.Score == best && !c.Chosen {
				avoided++ // the best candidate, passed over as a repeat
			}
		}
		if recent[got] && fresh {
			t.Errorf("request %d served %s again although a fresh candidate ranked within the margin", i, got)
		}
		served = append(served, got)
	}
	if avoided == 0 {
		t.Errorf("no request's best candidate was a recent repeat in 48 requests: the test exercised nothing")
	}

	a, err := g.Generate(context.Background(), Request{Text: "平安", N: 1, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.Generate(context.Background(), Request{Text: "平安", N: 1, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	if a[0].Upper != b[0].Upper || a[0].Lower != b[0].Lower {
		t.Errorf("seeded requests differ: %s / %s", a[0].Upper, b[0].Upper)
	}
}
