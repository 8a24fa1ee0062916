package couplet

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"chunlian/engine"
	"chunlian/sampler"
)

// Banner (横批) quality harness: how much do retrieval and ranking buy, and
// what does each cheaper configuration lose? For every couplet it scores,
// in one engine request, the model's own sampled 横批 and the top
// bqMaxK retrieved candidates (per-token raw log-probs of B1..B4 <eos>),
// then replays the choice each configuration would make from those numbers.
// Couplets: the real triples of ../shared/data/spring/with_banner.tsv (the
// true 横批 is known; banners.txt, one of the retrieval lists, holds it, so
// "true hit" measures whether prefilter + ranking recover it) and keyword
// couplets the pipeline itself writes. Run:
//
//	go test ./couplet -run '^$' -bench BannerQuality -benchtime 1x -v
const bqMaxK = 32

const withBannerPath = "../../shared/data/spring/with_banner.tsv"

type bqItem struct {
	full    []int32 // prompt … 下联 <ban>
	ctxText string  // what topBanners sees (prompt text + lines)
	truth   string  // the real 横批, "" for generated couplets
}

type bqScored struct {
	item  bqItem
	texts []string    // [1+k] candidate texts, [0] = the model's own
	lp    [][]float64 // [1+k][5] raw log-probs of B1..B4 <eos>
}

// bqConfig is one way to choose: the model's banner (if withModel) plus
// k retrieved candidates, ranked by the sum of the first nTok log-probs.
// The k are the first k of the lexical prefilter's order, or, with pool >
// k, the k with the highest log P(B1) among the first pool (B1's log-prob of
// every candidate comes from the one logits row at <ban>, so this second
// prefilter costs no forward rows).
type bqConfig struct {
	name      string
	withModel bool
	k         int
	nTok      int
	pool      int
	tier      bool // the pool narrowed by sharedTier first, as chooseBanners does
}

func (c bqConfig) choose(s *bqScored) int {
	keep := make([]bool, len(s.texts))
	keep[0] = c.withModel
	if c.pool > c.k {
		idx := make([]int, 0, c.pool)
		for i := 1; i <= c.pool && i < len(s.texts); i++ {
			idx = append(idx, i)
		}
		if c.tier {
			cands := make([]*bannerCand, len(idx))
			for j, i := range idx {
				cands[j] = &bannerCand{text: s.texts[i]}
				copy(cands[j].runes[:], []rune(s.texts[i]))
			}
			tier := sharedTier(cands, newBannerContext(s.item.ctxText))
			idx = slices.DeleteFunc(idx, func(i int) bool {
				return !slices.ContainsFunc(tier, func(c *bannerCand) bool { return c.text == s.texts[i] })
			})
		}
		sort.SliceStable(idx, func(a, b int) bool { return s.lp[idx[a]][0] > s.lp[idx[b]][0] })
		for _, i := range idx[:min(c.k, len(idx))] {
			keep[i] = true
		}
	} else {
		for i := 1; i <= c.k && i < len(s.texts); i++ {
			keep[i] = true
		}
	}
	best, bv := -1, math.Inf(-1)
	for i := range s.texts {
		if !keep[i] {
			continue
		}
		v := 0.0
		for _, x := range s.lp[i][:c.nTok] {
			v += x
		}
		if v > bv {
			best, bv = i, v
		}
	}
	return best
}

func bqTriples(b *testing.B, g *Generator) []bqItem {
	f, err := os.Open(withBannerPath)
	if err != nil {
		b.Logf("no real triples (%v): generated couplets only", err)
		return nil
	}
	defer f.Close()
	var out []bqItem
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Split(sc.Text(), "\t")
		if len(parts) != 3 || len([]rune(parts[2])) != 4 {
			continue
		}
		up, lo := parts[0], parts[1]
		ur, lr := []rune(up), []rune(lo)
		// Line order is not guaranteed in this file: 仄起平收 decides.
		if CharTone(ur[len(ur)-1]) == TonePing && CharTone(lr[len(lr)-1]) == ToneZe {
			up, lo = lo, up
		}
		p, err := g.t.prepare(Request{Mode: ModeLower, Text: up}, DefaultTemperature)
		if err != nil {
			continue
		}
		full := g.prompt(p)
		ok := true
		for _, r := range lo {
			id, known := g.t.vocab.ID(string(r))
			ok = ok && known
			full = append(full, id)
		}
		if !ok || len([]rune(lo)) != p.lineLen {
			continue
		}
		full = append(full, g.t.sp.Banner)
		out = append(out, bqItem{full: full, ctxText: g.t.text(g.prompt(p)) + up + lo, truth: parts[2]})
	}
	return out
}

func bqGenerated(b *testing.B, g *Generator, n int) []bqItem {
	words := []string{"平安", "富贵", "吉祥", "如意", "福寿", "康宁", "兴旺", "团圆", "和顺", "安康",
		"新春", "迎春", "纳福", "丰年", "喜庆", "春风", "万福", "长寿", "幸福", "美满"}
	var out []bqItem
	for i := 0; len(out) < n && i < 4*n; i++ {
		p, err := g.t.prepare(Request{Text: words[i%len(words)], Seed: uint64(1000 + i)}, DefaultTemperature)
		if err != nil {
			continue
		}
		prompt := g.prompt(p)
		res, err := g.e.Generate(context.Background(), g.engineRequest(p, prompt, 0, 1, true))
		if err != nil {
			b.Fatal(err)
		}
		cd := g.parseConstrained(p, res.Completions[0])
		if cd == nil {
			continue
		}
		full := append(append(append(append([]int32(nil), prompt...), cd.upperIDs...), g.t.sp.Sep), cd.lowerIDs...)
		full = append(full, g.t.sp.Banner)
		out = append(out, bqItem{full: full, ctxText: g.t.text(prompt) + cd.c.Upper + cd.c.Lower})
	}
	return out
}

// bqScore runs the one request per item: sample 0 writes the model's own
// 横批 (default temperature, four Chinese characters then <eos>), sample i
// is forced through retrieved candidate i.
func bqScore(b *testing.B, g *Generator, it bqItem, seed uint64) *bqScored {
	sp := g.t.sp
	s := &bqScored{item: it, texts: []string{""}}
	seqs := [][]int32{nil}
	for _, c := range topBanners(g.banners, newBannerContext(it.ctxText), bqMaxK) {
		s.texts = append(s.texts, c.text)
		seqs = append(seqs, append(append([]int32(nil), c.ids[:]...), sp.EOS))
	}
	bp := bannerProc{t: g.t}
	req := &engine.Request{
		Prompt: it.full,
		Params: sampler.Params{Temperature: DefaultTemperature, TopP: DefaultTopP, MaxTokens: 5, StopTokens: []int32{sp.EOS}, N: len(seqs), Seed: seed},
		NewProcessor: func(i int) sampler.LogitsProcessor {
			if i == 0 {
				return bp
			}
			return sampler.LogitsProcessorFunc(func(gen []int32, l []float32) error {
				if len(gen) >= len(seqs[i]) {
					return sampler.ErrDeadEnd
				}
				return sampler.Force(l, seqs[i][len(gen)])
			})
		},
	}
	res, err := g.e.Generate(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	s.lp = make([][]float64, len(seqs))
	for _, c := range res.Completions {
		if len(c.LogProbs) != 5 || c.Finish != engine.FinishStop {
			b.Fatalf("candidate %d: %d tokens, finish %s", c.Index, len(c.Tokens), c.Finish)
		}
		if c.Index == 0 {
			s.texts[0] = g.t.text(c.Tokens[:4])
		}
		for _, v := range c.LogProbs {
			s.lp[c.Index] = append(s.lp[c.Index], float64(v))
		}
	}
	return s
}

func BenchmarkBannerQuality(b *testing.B) {
	m := defaultModel(b)
	g, err := New(m, realStack(b, m), WithBannerSources(testBannerSources()...))
	if err != nil {
		b.Fatal(err)
	}
	if g.NumBanners() < bqMaxK {
		b.Skipf("only %d retrieval candidates", g.NumBanners())
	}
	sets := []struct {
		name  string
		items []bqItem
	}{
		{"real triples (with_banner.tsv)", bqTriples(b, g)},
		{"generated keyword couplets", bqGenerated(b, g, 120)},
	}
	configs := []bqConfig{
		{"model 横批 only", true, 0, 5, 0, false},
		{"retrieved 8, no model", false, 8, 5, 0, false},
		{"model + 2", true, 2, 5, 0, false},
		{"model + 4", true, 4, 5, 0, false},
		{"model + 8 lexical, with <eos> (old default)", true, 8, 5, 0, false},
		{"model + 16", true, 16, 5, 0, false},
		{"model + 32 (reference)", true, 32, 5, 0, false},
		{"model + 4, no <eos>", true, 4, 4, 0, false},
		{"model + 8, no <eos>", true, 8, 4, 0, false},
		{"model + B1-best 2 of 8, no <eos>", true, 2, 4, 8, false},
		{"model + B1-best 4 of 8, no <eos>", true, 4, 4, 8, false},
		{"model + B1-best 2 of 32, no <eos>", true, 2, 4, 32, false},
		{"B1-best 2 of 32, no <eos> (default until 2026-12-06)", false, 2, 4, 32, false},
		{"B1-best 2 of the 32's shared tier, no <eos> (default)", false, 2, 4, 32, true},
		{"model + B1-best 4 of 32, no <eos>", true, 4, 4, 32, false},
		{"model + B1-best 8 of 32, no <eos>", true, 8, 4, 32, false},
	}
	def := 4
	for i := 0; i < b.N; i++ {
		for _, set := range sets {
			if len(set.items) == 0 {
				continue
			}
			scored := make([]*bqScored, len(set.items))
			for j, it := range set.items {
				scored[j] = bqScore(b, g, it, uint64(j+1))
			}
			var sb strings.Builder
			fmt.Fprintf(&sb, "\n%s: %d couplets\n\n", set.name, len(scored))
			fmt.Fprintln(&sb, "| choice | mean log P per token (B1..B4 <eos>) | same as old default | model's own chosen | true 横批 chosen |")
			fmt.Fprintln(&sb, "|---|---|---|---|---|")
			for _, c := range configs {
				var ref, same, own, hit, truthN float64
				for _, s := range scored {
					k := c.choose(s)
					for _, v := range s.lp[k] {
						ref += v / 5
					}
					if s.texts[k] == s.texts[configs[def].choose(s)] {
						same++
					}
					if k == 0 {
						own++
					}
					if s.item.truth != "" {
						truthN++
						if s.texts[k] == s.item.truth {
							hit++
						}
					}
				}
				n := float64(len(scored))
				th := "–"
				if truthN > 0 {
					th = fmt.Sprintf("%.1f%%", 100*hit/truthN)
				}
				fmt.Fprintf(&sb, "| %s | %.3f | %.1f%% | %.1f%% | %s |\n", c.name, ref/n, 100*same/n, 100*own/n, th)
			}
			var inPool, truthN float64
			for _, s := range scored {
				if s.item.truth == "" {
					continue
				}
				truthN++
				for _, t := range s.texts[1:] {
					if t == s.item.truth {
						inPool++
						break
					}
				}
			}
			if truthN > 0 {
				fmt.Fprintf(&sb, "\ntrue 横批 among the top %d retrieved: %.1f%%\n", bqMaxK, 100*inPool/truthN)
			}
			b.Log(sb.String())
		}
	}
}

// BenchmarkBannerUpperOnly asks whether 横批 scoring could start before the
// 下联 is finished (overlapping the lower's decode steps): it scores the
// same top-32 lexical pool after the full couplet (A: prompt 上联 <sep> 下联
// <ban>) and after the 上联 alone (B: prompt 上联 <sep> <ban>, a layout the
// model never saw), picks "B1-best 4 of 32" under each, and reports how
// often B's pick equals A's and the mean per-token log P under A of each
// pick. The model's own 横批 is left out of both (it would have to be
// written under B too).
func BenchmarkBannerUpperOnly(b *testing.B) {
	m := defaultModel(b)
	g, err := New(m, realStack(b, m), WithBannerSources(testBannerSources()...))
	if err != nil {
		b.Fatal(err)
	}
	items := bqGenerated(b, g, 120)
	cfg := bqConfig{name: "B1-best 4 of 32", withModel: false, k: 4, nTok: 4, pool: 32}
	for i := 0; i < b.N; i++ {
		var same, lpA, lpB float64
		for j, it := range items {
			a := bqScore(b, g, it, uint64(j+1))
			// B: drop the 下联 (and its <sep>… keep <sep>): prompt 上联 <sep> <ban>.
			L := (len(it.full) - 1 - len(g.prompt(mustPlan(b, g))) - 1) / 2
			bFull := append(slices.Clone(it.full[:len(it.full)-1-L]), g.t.sp.Banner)
			itB := it
			itB.full = bFull
			sb := bqScore(b, g, itB, uint64(j+1))
			// Same pool in the same order (the lexical prefilter saw the
			// whole couplet in both; only the model's context differs).
			ka, kb := cfg.choose(a), cfg.choose(sb)
			if a.texts[ka] == sb.texts[kb] {
				same++
			}
			for _, v := range a.lp[ka][:4] {
				lpA += v / 4
			}
			for _, v := range a.lp[kb][:4] {
				lpB += v / 4
			}
		}
		n := float64(len(items))
		b.Logf("\n%d generated keyword couplets, retrieved candidates only (%s):\n\n| scored after | same pick as full couplet | mean log P per char (B1..B4 | full couplet) of the pick |\n|---|---|---|\n| full couplet | 100%% | %.3f |\n| 上联 only | %.1f%% | %.3f |\n", len(items), cfg.name, lpA/n, 100*same/n, lpB/n)
	}
}

func mustPlan(b *testing.B, g *Generator) *plan {
	p, err := g.t.prepare(Request{Text: "平安"}, DefaultTemperature)
	if err != nil {
		b.Fatal(err)
	}
	return p
}
