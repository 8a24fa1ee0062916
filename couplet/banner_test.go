package couplet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"

	"chunlian/engine"
)

// topBannersRef is the straightforward definition: stable sort of every
// candidate by relevance, best first, then the first k.
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
		return relevance(&cands[idx[a]], ctx) > relevance(&cands[idx[b]], ctx)
	})
	var out []*bannerCand
	for _, i := range idx[:min(k, len(idx))] {
		out = append(out, &cands[i])
	}
	return out
}

// TestTopBanners: the bounded-buffer selection returns exactly what a full
// stable sort would, for random lists (many ties), contexts and k.
func TestTopBanners(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()})
	alphabet := []rune("春福年喜安康吉祥如意平富贵门家和顺兴旺人天地山水风花月")
	rng := rand.New(rand.NewPCG(1, 2))
	word := func() string {
		rs := make([]rune, 4)
		for i := range rs {
			rs[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(rs)
	}
	for trial := 0; trial < 200; trial++ {
		n := rng.IntN(60)
		var lines []string
		for range n {
			lines = append(lines, word())
		}
		cands := g.t.parseBanners(stringsReader(lines), trial%2, map[string]bool{}, nil)
		text := word() + word()
		for _, k := range []int{0, 1, 3, 8, 32, 100} {
			got, want := topBanners(cands, text, k), topBannersRef(cands, text, k)
			if fmt.Sprint(got) != fmt.Sprint(want) || len(got) != min(k, len(cands)) {
				t.Fatalf("trial %d k=%d: got %d %v, want %d %v", trial, k, len(got), got, len(want), want)
			}
		}
	}
}

func BenchmarkTopBanners(b *testing.B) {
	m := defaultModel(b)
	g, err := New(m, &fakeEngine{vocab: m.Tok.Size()}, WithBannerSources(testBannerSources()...))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		topBanners(g.banners, "平安平安二字平安福和睦一家幸福家", DefaultBannerPool)
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
			want := topBanners(g.banners, "平安"+cs[0].Upper+cs[0].Lower, 1)[0].text
			if cs[0].Banner != want || !Check(cs[0].Upper, cs[0].Lower, cs[0].Banner).OK() {
				t.Errorf("got %+v; want the lines with fallback 横批 %s", cs[0], want)
			}
		})
	}
}
