package couplet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"chunlian/engine"
)

// relevanceRef is relevance's definition (and its code before runeSet):
// the candidate's text decoded, a map of the context's characters.
func relevanceRef(c *bannerCand, context map[rune]bool) int {
	s := c.base
	for _, r := range c.text {
		if context[r] {
			s += 4
		}
	}
	return s
}

// topBannersRef is the straightforward definition: stable sort of every
// candidate by relevanceRef, best first, then the first k.
func topBannersRef(cands []bannerCand, text string, k int) []*bannerCand {
	ctx := map[rune]bool{}
	for _, r := range text {
		if IsHan(r) {
			ctx[r] = true
		}
	}
	idx := make([]int, len(cands))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		return relevanceRef(&cands[idx[a]], ctx) > relevanceRef(&cands[idx[b]], ctx)
	})
	var out []*bannerCand
	for _, i := range idx[:min(k, len(idx))] {
		out = append(out, &cands[i])
	}
	return out
}

// randomWords returns a source of random four-character words over
// alphabet: a small alphabet gives many shared characters and ties.
func randomWords(rng *rand.Rand, alphabet string) func() string {
	rs := []rune(alphabet)
	return func() string {
		w := make([]rune, 4)
		for i := range w {
			w[i] = rs[rng.IntN(len(rs))]
		}
		return string(w)
	}
}

// TestTopBanners: the bounded-buffer selection returns exactly what a full
// stable sort would, for random lists (many ties), contexts and k.
func TestTopBanners(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()})
	rng := rand.New(rand.NewPCG(1, 2))
	word := randomWords(rng, "春福年喜安康吉祥如意平富贵门家和顺兴旺人天地山水风花月")
	for trial := 0; trial < 200; trial++ {
		n := rng.IntN(60)
		var lines []string
		for range n {
			lines = append(lines, word())
		}
		cands := g.t.parseBanners(strings.NewReader(strings.Join(lines, "\n")), trial%2, map[string]bool{}, nil)
		text := word() + word()
		for _, k := range []int{0, 1, 3, 8, 32, 100} {
			got, want := topBanners(cands, newBannerContext(text), k), topBannersRef(cands, text, k)
			if fmt.Sprint(got) != fmt.Sprint(want) || len(got) != min(k, len(cands)) {
				t.Fatalf("trial %d k=%d: got %d %v, want %d %v", trial, k, len(got), got, len(want), want)
			}
		}
	}
}

// topBannersOld is topBanners before runeSet (a map of the context's
// characters, relevanceRef), the "old" side of BenchmarkTopBanners.
func topBannersOld(cands []bannerCand, text string, k int) []*bannerCand {
	if k <= 0 || len(cands) == 0 {
		return nil
	}
	ctx := map[rune]bool{}
	for _, r := range text {
		if IsHan(r) {
			ctx[r] = true
		}
	}
	type scored struct {
		c *bannerCand
		s int
	}
	top := make([]scored, 0, k+1)
	for i := range cands {
		s := relevanceRef(&cands[i], ctx)
		if len(top) == k && s <= top[k-1].s {
			continue
		}
		j := len(top)
		for j > 0 && top[j-1].s < s {
			j--
		}
		top = append(top, scored{})
		copy(top[j+1:], top[j:])
		top[j] = scored{&cands[i], s}
		if len(top) > k {
			top = top[:k]
		}
	}
	out := make([]*bannerCand, len(top))
	for i, s := range top {
		out[i] = s.c
	}
	return out
}

// TestRuneSet: membership agrees with a map for random runes, including
// runes that share the filter's bit (equal low 12 bits) with a member.
func TestRuneSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 200; trial++ {
		var s runeSet
		want := map[rune]bool{}
		var probes []rune
		for range rng.IntN(80) {
			r := rune(0x3400 + rng.IntN(0x6000))
			s.add(r)
			want[r] = true
			probes = append(probes, r, r+4096, r-4096, r^1, r+64)
		}
		for range 50 {
			probes = append(probes, rune(rng.IntN(0x30000)))
		}
		for _, r := range probes {
			if s.has(r) != want[r] {
				t.Fatalf("trial %d: has(%U) = %v, want %v", trial, r, s.has(r), want[r])
			}
		}
		if len(s.runes) != len(want) {
			t.Fatalf("trial %d: %d runes kept, want %d distinct", trial, len(s.runes), len(want))
		}
	}
}

// BenchmarkTopBanners: one 横批 prefilter over the shipped and test lists,
// old (map) and new (runeSet) in the same run.
func BenchmarkTopBanners(b *testing.B) {
	m := defaultModel(b)
	g, err := New(m, &fakeEngine{vocab: m.Tok.Size()}, WithBannerSources(testBannerSources()...))
	if err != nil {
		b.Fatal(err)
	}
	const text = "平安平安二字平安福和睦一家幸福家"
	if fmt.Sprint(topBanners(g.banners, newBannerContext(text), DefaultBannerPool)) != fmt.Sprint(topBannersOld(g.banners, text, DefaultBannerPool)) {
		b.Fatal("old and new differ")
	}
	b.Logf("%d candidates", len(g.banners))
	for _, impl := range []struct {
		name string
		f    func([]bannerCand, string, int) []*bannerCand
	}{{"old", topBannersOld}, {"new", func(c []bannerCand, text string, k int) []*bannerCand {
		return topBanners(c, newBannerContext(text), k)
	}}} {
		b.Run(impl.name, func(b *testing.B) {
			for b.Loop() {
				impl.f(g.banners, text, DefaultBannerPool)
			}
		})
	}
}

// TestForcedBannerConcurrent: the forced 横批 samples of one request share a
// bannerAssign; an engine may run their processors on different goroutines
// at once (first step: every sample sees the same <ban> row). Each must
// force its own slot's candidate, whichever call assigns (run with -race).
func TestForcedBannerConcurrent(t *testing.T) {
	const V, k = 50, 6
	pool := make([]*bannerCand, 20) // [20] first ids 0..19, second..fourth ids 20+
	for i := range pool {
		pool[i] = &bannerCand{ids: [4]int32{int32(i), 20 + int32(i%5), 30, 40}}
	}
	row := make([]float32, V) // [V] logits at <ban>: id i has logit i%7
	for i := range row {
		row[i] = float32(i % 7)
	}
	want := assignByFirstChar(pool, row, k)
	for trial := 0; trial < 20; trial++ {
		a := &bannerAssign{pool: pool, k: k}
		got := make([][]int32, k+2) // [k+2] per slot: the token forced at each step, -1 on dead end
		var wg sync.WaitGroup
		for slot := range k + 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := forcedBanner{a: a, slot: slot}
				var gen []int32
				for step := 0; step < 4; step++ {
					l := slices.Clone(row)
					if err := p.Process(gen, l); err != nil {
						got[slot] = append(got[slot], -1)
						return
					}
					tok := int32(slices.Index(l, slices.Max(l)))
					gen = append(gen, tok)
					got[slot] = append(got[slot], tok)
				}
			}()
		}
		wg.Wait()
		for slot := range k + 2 {
			if slot < len(want) {
				if !slices.Equal(got[slot], want[slot][:]) {
					t.Fatalf("slot %d forced %v, want %v", slot, got[slot], want[slot])
				}
			} else if !slices.Equal(got[slot], []int32{-1}) {
				t.Fatalf("slot %d beyond the %d candidates forced %v, want a dead end", slot, len(want), got[slot])
			}
		}
	}
}

// refuseBanner wraps an engine and answers every 横批 request (prompt ending
// in <ban>) with err.
type refuseBanner struct {
	engine.Engine
	ban int32
	err error
}

func (r refuseBanner) Generate(ctx context.Context, req *engine.Request) (*engine.Result, error) {
	if n := len(req.Prompt); n > 0 && req.Prompt[n-1] == r.ban {
		return nil, r.err
	}
	return r.Engine.Generate(ctx, req)
}

// TestBannerRequestRefused: when the engine refuses the 横批 request (queue
// full), the couplet keeps its lines and gets the most relevant retrieved
// 横批; without retrieval lists the error is returned.
func TestBannerRequestRefused(t *testing.T) {
	probe := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()})
	ban := probe.t.sp.Banner
	for _, c := range []struct {
		name    string
		opts    []Option
		wantErr bool
	}{
		{"retrieval", nil, false},
		{"retrieval, k=0", []Option{WithBannerTopK(0)}, false},
		{"no retrieval lists", []Option{WithBannerSources(), WithBannerTopK(0)}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			fe := refuseBanner{&fakeEngine{vocab: testModel.Tok.Size()}, ban, engine.ErrQueueFull}
			opts := c.opts
			g := newFakeGen(t, fe, opts...)
			if c.wantErr {
				// newFakeGen adds inline banners; build without them.
				var err error
				g, err = New(testModel, fe, opts...)
				if err != nil {
					t.Fatal(err)
				}
			}
			cs, err := g.Generate(context.Background(), Request{Text: "平安", Seed: 4})
			if c.wantErr {
				if !errors.Is(err, engine.ErrQueueFull) {
					t.Fatalf("got %v, %v; want ErrQueueFull", cs, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := topBanners(g.banners, newBannerContext("平安"+cs[0].Upper+cs[0].Lower), 1)[0].text
			if cs[0].Banner != want || !Check(cs[0].Upper, cs[0].Lower, cs[0].Banner).OK() {
				t.Errorf("got %+v; want the lines with fallback 横批 %s", cs[0], want)
			}
		})
	}
}

// TestPickBanner: the best-scoring complete sample wins, a forced sample
// only with its assigned candidate, and a 横批 that repeats four characters
// of a line only when every complete sample does.
func TestPickBanner(t *testing.T) {
	g, err := New(testModel, &fakeEngine{vocab: testModel.Tok.Size()}, WithBannerSources())
	if err != nil {
		t.Fatal(err)
	}
	ids := func(s string) []int32 { return charIDs(t, g, s) }
	comp := func(index int, text string, lp float32) engine.Completion {
		return engine.Completion{Index: index, Tokens: ids(text), LogProbs: []float32{lp, lp, lp, lp}, Finish: engine.FinishLength}
	}
	const upper, lower = "春回大地万象新", "福满人间四季安"
	slots := [][4]int32{[4]int32(ids("五福临门")), [4]int32(ids("万象更新")), [4]int32(ids("春回大地")), [4]int32(ids("福满人间"))}
	cases := []struct {
		name   string
		forced bool
		comps  []engine.Completion
		want   string
	}{
		{"best sum wins", true, []engine.Completion{comp(1, "万象更新", -2), comp(0, "五福临门", -1)}, "五福临门"},
		{"copy of the 下联 loses", true, []engine.Completion{comp(3, "福满人间", -0.5), comp(0, "五福临门", -1)}, "五福临门"},
		{"copy of the 上联 loses", true, []engine.Completion{comp(2, "春回大地", -0.1), comp(0, "五福临门", -4), comp(1, "万象更新", -3)}, "万象更新"},
		{"only copies: the best copy", true, []engine.Completion{comp(2, "春回大地", -2), comp(3, "福满人间", -1)}, "福满人间"},
		{"forced sample that wrote another text", true, []engine.Completion{comp(0, "国泰民安", -1), comp(1, "万象更新", -2)}, "万象更新"},
		{"the model's own when nothing is forced", false, []engine.Completion{comp(0, "国泰民安", -1)}, "国泰民安"},
		{"incomplete samples", true, []engine.Completion{{Index: 0, Tokens: ids("万象"), LogProbs: []float32{-1, -1}, Finish: engine.FinishDeadEnd}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := &bannerAssign{k: len(slots), done: true, slots: slots}
			best, _ := g.pickBanner(tc.comps, a, tc.forced, upper, lower)
			if got := g.t.text(best); got != tc.want {
				t.Errorf("picked %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSharedTier: the pool narrows to the candidates sharing the most
// distinct characters with the text, in pool order; copies of the text do
// not set the tier unless all are copies; nothing shared keeps the pool.
func TestSharedTier(t *testing.T) {
	mk := func(s string) *bannerCand {
		c := &bannerCand{text: s}
		copy(c.runes[:], []rune(s))
		return c
	}
	texts := func(p []*bannerCand) []string {
		var out []string
		for _, c := range p {
			out = append(out, c.text)
		}
		return out
	}
	for _, c := range []struct {
		text string
		pool []string
		want []string
	}{
		{"门前柳色年年绿院内桃花岁岁红", []string{"满园春色", "柳绿花红", "喜迎新春", "桃红柳绿"}, []string{"柳绿花红", "桃红柳绿"}},
		// 大吉大利 shares 大 once, not twice.
		{"大海潮音风起韵长天月色夜来香", []string{"大吉大利", "春色满园", "风调雨顺"}, []string{"大吉大利", "春色满园", "风调雨顺"}},
		// 春满人间 copies the 上联: 春暖人间 sets the tier.
		{"春满人间世界好喜盈天下百业兴", []string{"春满人间", "天地同春", "春暖人间"}, []string{"春暖人间"}},
		{"春满人间世界好", []string{"春满人间"}, []string{"春满人间"}},
		{"山中有酒千秋醉", []string{"万象更新", "龙凤呈祥"}, []string{"万象更新", "龙凤呈祥"}},
	} {
		pool := make([]*bannerCand, len(c.pool))
		for i, s := range c.pool {
			pool[i] = mk(s)
		}
		if got := texts(sharedTier(pool, newBannerContext(c.text))); !slices.Equal(got, c.want) {
			t.Errorf("sharedTier(%v, %s) = %v, want %v", c.pool, c.text, got, c.want)
		}
	}
}

// TestBannerOneCandidate: a request for one couplet whose pool holds a
// single candidate takes it without a 横批 request; a request for two
// still scores it (the banner term orders the couplets).
func TestBannerOneCandidate(t *testing.T) {
	for _, n := range []int{1, 2} {
		fe := &fakeEngine{vocab: testModel.Tok.Size()}
		g, err := New(testModel, fe, WithBannerSources(), WithBanners("吉星高照"))
		if err != nil {
			t.Fatal(err)
		}
		cs, err := g.Generate(context.Background(), Request{Text: "吉祥", N: n, Seed: 3})
		if err != nil || len(cs) == 0 {
			t.Fatalf("n=%d: %v, %v", n, cs, err)
		}
		for _, c := range cs {
			if c.Banner != "吉星高照" {
				t.Errorf("n=%d: banner %q, want 吉星高照", n, c.Banner)
			}
		}
		if want := map[int]int{1: 0, 2: len(cs)}[n]; fe.bannerCalls != want {
			t.Errorf("n=%d: %d 横批 requests, want %d", n, fe.bannerCalls, want)
		}
	}
}

// sharedTierRef is sharedTier written plainly (a map of the context's
// characters; the shared count and the copy test recomputed per use).
func sharedTierRef(pool []*bannerCand, text string) []*bannerCand {
	ctx := map[rune]bool{}
	for _, r := range text {
		if IsHan(r) {
			ctx[r] = true
		}
	}
	shared := func(c *bannerCand) int { // distinct characters: 大吉大利 shares 大 once
		n := 0
		for i, r := range c.runes {
			if ctx[r] && !slices.Contains(c.runes[:i], r) {
				n++
			}
		}
		return n
	}
	copies := 0
	for _, c := range pool {
		if strings.Contains(text, c.text) {
			copies++
		}
	}
	counts := func(c *bannerCand) bool { return copies == len(pool) || !strings.Contains(text, c.text) }
	best := 0
	for _, c := range pool {
		if counts(c) {
			best = max(best, shared(c))
		}
	}
	out := pool[:0:0]
	for _, c := range pool {
		if counts(c) && shared(c) == best {
			out = append(out, c)
		}
	}
	return out
}

// TestSharedTierMatchesRef: sharedTier keeps exactly what sharedTierRef
// does for random pools (repeated characters, copies of the text, pools
// of copies only) and contexts.
func TestSharedTierMatchesRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	word := randomWords(rng, "春福年喜安康吉大利")
	for trial := 0; trial < 2000; trial++ {
		text := word() + "，" + word() + word()
		var pool []*bannerCand
		for range rng.IntN(70) {
			w := word()
			switch rng.IntN(4) {
			case 0: // a copy of part of the text
				at := []int{0, 5, 9}[rng.IntN(3)] * 3
				w = text[at : at+12]
			}
			c := &bannerCand{text: w}
			copy(c.runes[:], []rune(w))
			pool = append(pool, c)
		}
		got, want := sharedTier(pool, newBannerContext(text)), sharedTierRef(pool, text)
		if !slices.Equal(got, want) {
			str := func(p []*bannerCand) (s []string) {
				for _, c := range p {
					s = append(s, c.text)
				}
				return s
			}
			t.Fatalf("trial %d, %s: got %v, want %v", trial, text, str(got), str(want))
		}
	}
}

// BenchmarkBannerPool: a couplet's 横批 pool (topBanners, then sharedTier)
// over the shipped list, with one context (new) and with sharedTierRef.
func BenchmarkBannerPool(b *testing.B) {
	m := defaultModel(b)
	g, err := New(m, &fakeEngine{vocab: m.Tok.Size()})
	if err != nil {
		b.Fatal(err)
	}
	const text = "平安平安二字平安福和睦一家幸福家"
	b.Logf("%d candidates", len(g.banners))
	b.Run("ref", func(b *testing.B) {
		for b.Loop() {
			sharedTierRef(topBanners(g.banners, newBannerContext(text), DefaultBannerPool), text)
		}
	})
	b.Run("new", func(b *testing.B) {
		for b.Loop() {
			bc := newBannerContext(text)
			sharedTier(topBanners(g.banners, bc, DefaultBannerPool), bc)
		}
	})
}
