package couplet

import (
	"bufio"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
)

// Banner (横批) retrieval. The model writes its own 横批 (four Chinese
// characters) after each chosen couplet; retrieval adds real 横批 and
// 4-character idioms. Retrieved candidates are prefiltered here by relevance
// (characters shared with the couplet and keyword, spring theme) into a
// pool; bannerstage.go picks the pool's likeliest by the model's first
// character and ranks them with the model's own by log P(B1..B4 | couplet).

// springChars are characters typical of 春联 banners; a candidate with
// them is preferred when nothing overlaps with the couplet.
const springChars = "春福新年喜庆吉祥瑞安康泰乐丰财富贵顺和兴旺盛美满门家寿祺禧欢迎辞岁花开景明光辉鸿运万事如意象更"

// bannerCand is one retrieval candidate, already checked against the
// vocabulary.
type bannerCand struct {
	ids   [4]int32
	runes [4]rune // the characters of text
	text  string
	prior int // 1 for real 横批 lists (banners.txt), 0 for idioms
	base  int // prior + spring-theme characters: the context-free part of relevance
}

// parseBanners reads one candidate per line; lines that are not exactly four
// Chinese characters known to the vocabulary are skipped.
func (t *tables) parseBanners(r io.Reader, prior int, seen map[string]bool, out []bannerCand) []bannerCand {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rs := []rune(line)
		if len(rs) != 4 || seen[line] {
			continue
		}
		var c bannerCand
		ok := true
		for i, ch := range rs {
			id, known := t.charID(ch)
			if !known || !IsHan(ch) {
				ok = false
				break
			}
			c.ids[i], c.runes[i] = id, ch
		}
		if ok {
			c.text, c.prior = line, prior
			c.base = prior
			for _, r := range rs {
				if strings.ContainsRune(springChars, r) {
					c.base++
				}
			}
			seen[line] = true
			out = append(out, c)
		}
	}
	return out
}

// BannerSource names a candidate list: a file path (os) or a path in FS.
type BannerSource struct {
	FS    fs.FS // nil = the OS file system
	Path  string
	Prior int // 1 for real 横批 lists, 0 for idiom lists
}

// loadBanners reads every source that can be opened; missing ones are
// skipped (the shared data directory is not shipped with the binary).
func (t *tables) loadBanners(srcs []BannerSource) (cands []bannerCand, used []string) {
	seen := map[string]bool{}
	for _, s := range srcs {
		var f io.ReadCloser
		var err error
		if s.FS != nil {
			f, err = s.FS.Open(s.Path)
		} else {
			f, err = os.Open(s.Path)
		}
		if err != nil {
			continue
		}
		before := len(cands)
		cands = t.parseBanners(f, s.Prior, seen, cands)
		f.Close()
		if len(cands) > before {
			used = append(used, s.Path)
		}
	}
	return cands, used
}

// relevance scores a candidate for a couplet: shared characters count most
// (4 each, per position of the candidate), then spring-theme characters,
// then the source prior (c.base).
func relevance(c *bannerCand, context *runeSet) int {
	s := c.base
	for _, r := range c.runes {
		if context.has(r) {
			s += 4
		}
	}
	return s
}

// runeSet is the set of a context's Chinese characters for relevance,
// which looks up every character of every candidate (thousands per call):
// a 4096-bit filter on the low 12 bits of each rune rejects almost all of
// them with one bit test (a context has a few dozen characters), and the
// few that pass are checked exactly against the runes. A map lookup per
// character was most of topBanners' time.
type runeSet struct {
	filter [64]uint64
	runes  []rune
}

func (s *runeSet) add(r rune) {
	if !s.has(r) {
		s.filter[r>>6&63] |= 1 << (r & 63)
		s.runes = append(s.runes, r)
	}
}

func (s *runeSet) has(r rune) bool {
	if s.filter[r>>6&63]&(1<<(r&63)) == 0 {
		return false
	}
	for _, x := range s.runes {
		if x == r {
			return true
		}
	}
	return false
}

// bannerContext is the text a 横批 is chosen for (keyword, 上联, 下联) with
// the set of its Chinese characters, built once per couplet for both
// topBanners and sharedTier.
type bannerContext struct {
	text  string
	chars runeSet
}

func newBannerContext(text string) *bannerContext {
	c := &bannerContext{text: text}
	c.chars.runes = make([]rune, 0, 64)
	for _, r := range text {
		if IsHan(r) {
			c.chars.add(r)
		}
	}
	return c
}

// sharedTier keeps the candidates of pool that share the most characters
// with the context (relevance order kept); all of pool when none shares
// any. A candidate that the text contains whole (a copy, which pickBanner
// ranks last) does not set the tier unless every candidate is one. Blind
// readers found a 横批 fits far more often when it shares as many of the
// couplet's characters as any listed one does (docs/DECISIONS.md, "横批
// candidates"), so the model chooses only within that tier.
func sharedTier(pool []*bannerCand, ctx *bannerContext) []*bannerCand {
	// shared[i]: pool[i]'s distinct characters in the context (大吉大利
	// shares 大 once), plus isCopy when the text contains it whole. A copy
	// has all four characters in the context, so only then is the text
	// searched.
	const isCopy = 8
	var buf [64]int8
	shared := buf[:0]
	if len(pool) > len(buf) {
		shared = make([]int8, 0, len(pool))
	}
	copies := 0
	for _, c := range pool {
		n, at := int8(0), 0
		for i, r := range c.runes {
			if ctx.chars.has(r) {
				at++
				if !slices.Contains(c.runes[:i], r) {
					n++
				}
			}
		}
		if at == len(c.runes) && strings.Contains(ctx.text, c.text) {
			n += isCopy
			copies++
		}
		shared = append(shared, n)
	}
	if copies == len(pool) { // every one a copy: they compete by shared count
		for i := range shared {
			shared[i] -= isCopy
		}
	}
	best := int8(0)
	for _, n := range shared {
		if n < isCopy {
			best = max(best, n)
		}
	}
	out := pool[:0:0]
	for i, c := range pool {
		if shared[i] == best {
			out = append(out, c)
		}
	}
	return out
}

// topBanners returns up to k candidates most relevant to the text, best
// first (ties keep list order, real 横批 lists first). It keeps a sorted
// buffer of the best k while scanning (O(n·k) worst case, O(n) typical),
// instead of sorting all n: it runs once per couplet on the request path.
func topBanners(cands []bannerCand, ctx *bannerContext, k int) []*bannerCand {
	if k <= 0 || len(cands) == 0 {
		return nil
	}
	type scored struct {
		c *bannerCand
		s int
	}
	top := make([]scored, 0, k+1) // [≤k] best so far, by s descending, list order within ties
	for i := range cands {
		s := relevance(&cands[i], &ctx.chars)
		if len(top) == k && s <= top[k-1].s {
			continue
		}
		// Insert after every entry with score ≥ s (stable).
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
