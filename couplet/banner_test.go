package couplet

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
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
