package couplet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mozillazg/go-pinyin"

	"chunlian/engine"
	"chunlian/model"
	"chunlian/sampler"
)

// testModel is the shared random tiny model (synthetic vocabulary with
// specials, <len_1..32>, punctuation and ~400 common characters).
var testModel = model.NewRandom(model.TestConfig(), 1)

// blessings are keywords whose characters the test vocabulary holds.
var blessings = []string{"平安", "富贵", "吉祥", "如意", "新春", "福寿", "喜庆", "春风", "和顺", "兴旺", "安康", "团圆", "万福", "丰年", "迎春", "纳福"}

func newFakeGen(t testing.TB, fe engine.Engine, opts ...Option) *Generator {
	t.Helper()
	opts = append([]Option{WithBannerSources(), WithBanners("五福临门", "万象更新", "吉星高照", "春回大地", "国泰民安", "福满人间")}, opts...)
	g, err := New(testModel, fe, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// charIDs returns the ids of the characters of s (Han or punctuation
// tokens of g's vocabulary), failing the test for one it lacks.
func charIDs(t testing.TB, g *Generator, s string) []int32 {
	t.Helper()
	var out []int32
	for _, r := range s {
		id, ok := g.t.charID(r)
		if !ok {
			t.Fatalf("%c not in the test vocabulary", r)
		}
		out = append(out, id)
	}
	return out
}

func usableKeywords(t testing.TB, g *Generator) []string {
	var out []string
	for _, k := range blessings {
		if g.Validate(Request{Text: k}) == nil {
			out = append(out, k)
		}
	}
	if len(out) < 5 {
		t.Fatalf("only %d test keywords are in the test vocabulary", len(out))
	}
	return out
}

func TestCharTone(t *testing.T) {
	for _, c := range []struct {
		r    rune
		want Tone
	}{
		{'春', TonePing}, {'福', TonePing}, {'年', TonePing}, {'安', TonePing}, {'门', TonePing},
		{'岁', ToneZe}, {'乐', ToneZe}, {'好', ToneZe}, {'喜', ToneZe}, {'贵', ToneZe}, {'意', ToneZe},
		{'a', ToneUnknown}, {'，', ToneUnknown},
	} {
		if got := CharTone(c.r); got != c.want {
			t.Errorf("CharTone(%c) = %v, want %v", c.r, got, c.want)
		}
	}
}

// TestCharToneTable: the table CharTone reads gives charTone's class for
// every rune in the data and for runes outside it.
func TestCharToneTable(t *testing.T) {
	n := 0
	for k := range pinyin.PinyinDict {
		if got, want := CharTone(rune(k)), charTone(rune(k)); got != want {
			t.Fatalf("CharTone(%c) = %v, charTone %v", rune(k), got, want)
		}
		n++
	}
	for _, r := range []rune{-1, 'a', '，', 0x10FFFF, rune(len(toneTable()))} {
		if got, want := CharTone(r), charTone(r); got != want {
			t.Errorf("CharTone(%U) = %v, charTone %v", r, got, want)
		}
	}
	if n < 20000 {
		t.Fatalf("only %d runes in the pinyin data", n)
	}
}

// TestCharToneMatchesData cross-checks the go-pinyin derived classes with
// the corpus' own 平仄 table (primary reading), when the data is present.
// Every character is compared: the table's corrected version agrees with
// go-pinyin on all of them (its first version had tone 2 for every reading
// starting with "m").
func TestCharToneMatchesData(t *testing.T) {
	f, err := os.Open("../../shared/data/tones/char_pingze_modern.tsv")
	if err != nil {
		t.Skip("../shared/data/tones/char_pingze_modern.tsv not present; skipping data cross-check")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n, bad := 0, 0
	for sc.Scan() {
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) < 3 {
			continue
		}
		r := []rune(fs[0])
		want := map[string]Tone{"平": TonePing, "仄": ToneZe}[fs[2]]
		n++
		if CharTone(r[0]) != want {
			bad++
			if bad < 5 {
				t.Logf("%s: data %s, CharTone %v", fs[0], fs[2], CharTone(r[0]))
			}
		}
	}
	if n < 1000 || float64(bad) > 0.001*float64(n) {
		t.Fatalf("%d of %d characters disagree with the data table", bad, n)
	}
}

func TestClausesAndLayout(t *testing.T) {
	for _, c := range []struct {
		n      int
		layout string
	}{
		{3, "xxx"}, {5, "xxxxx"}, {7, "xxxxxxx"}, {8, "xxxx，xxxx"}, {9, "xxxx，xxxxx"},
		{10, "xxxxx，xxxxx"}, {11, "xxxx，xxxxxxx"}, {14, "xxxxxxx，xxxxxxx"},
		{15, "xxxx，xxxx，xxxxxxx"}, {21, "xxxxxxx，xxxxxxx，xxxxxxx"},
	} {
		var b strings.Builder
		chars := 0
		for _, r := range Layout(c.n) {
			if r == 0 {
				b.WriteRune('x')
				chars++
			} else {
				b.WriteRune(r)
			}
		}
		if b.String() != c.layout || chars != c.n {
			t.Errorf("Layout(%d) = %s (%d chars), want %s", c.n, b.String(), chars, c.layout)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		name                   string
		u, l, b                string
		r1, r2, r3, r4, sameCh bool
	}{
		{"classic", "天增岁月人增寿", "春满乾坤福满门", "四季长安", true, true, true, true, true},
		{"comma", "春回大地，万象更新岁", "福满人间，千家共庆年", "五福临门", true, true, true, true, true},
		{"length", "天增岁月人增寿", "春满乾坤福满", "四季长安", false, false, false, true, false},
		{"punct pos", "春回大地，万象更新岁", "福满人间千，家共庆年", "五福临门", false, true, true, true, true},
		{"latin", "天增岁月人增寿", "春满乾坤福满A", "四季长安", false, false, true, true, true},
		{"tone upper ping", "天增岁月人增春", "春满乾坤福满门", "四季长安", true, false, true, true, true},
		{"tone lower ze", "天增岁月人增寿", "春满乾坤福满岁", "四季长安", true, false, true, true, true},
		{"same char", "天增岁月人增寿", "天满乾坤福满门", "四季长安", true, true, false, true, false},
		{"unmirrored", "天增岁月人增寿", "春满乾坤福临门", "四季长安", true, true, false, true, true},
		{"banner 3", "天增岁月人增寿", "春满乾坤福满门", "四季长", true, true, true, false, true},
		{"banner punct", "天增岁月人增寿", "春满乾坤福满门", "四季，长", true, true, true, false, true},
		{"empty", "", "", "", false, false, false, false, false},
		{"leading punct", "，增岁月人增寿", "，满乾坤福满门", "四季长安", false, true, true, true, true},
	} {
		r := Check(c.u, c.l, c.b)
		if r.Rule1() != c.r1 || r.Rule2() != c.r2 || r.Rule3() != c.r3 || r.Rule4() != c.r4 || r.NoSameChar != c.sameCh {
			t.Errorf("%s: got %+v (rules %v %v %v %v)", c.name, r, r.Rule1(), r.Rule2(), r.Rule3(), r.Rule4())
		}
		if r.OK() != (c.r1 && c.r2 && c.r3 && c.r4) || (len(r.Failed()) == 0) != r.OK() {
			t.Errorf("%s: OK/Failed inconsistent: %v %v", c.name, r.OK(), r.Failed())
		}
	}
}

func TestValidate(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()})
	unknown := "龘" // not in the synthetic vocabulary
	if _, ok := testModel.Tok.ID(unknown); ok {
		t.Fatal("test assumes 龘 is unknown")
	}
	for _, c := range []struct {
		req  Request
		code string // "" = valid
	}{
		{Request{Text: "平安"}, ""},
		{Request{Text: " 平 安 "}, ""},
		{Request{Text: "平安", Mode: ModeAcrostic}, ""},
		{Request{Text: "平安", Length: 5}, ""},
		{Request{Text: "平安", Length: 11, N: 3}, ""},
		{Request{Text: "平安", Mode: "haiku"}, CodeBadMode},
		{Request{Text: ""}, CodeEmpty},
		{Request{Text: "   "}, CodeEmpty},
		{Request{Text: "平"}, CodeBadKeyword},
		{Request{Text: "平安喜"}, CodeBadKeyword},
		{Request{Text: "ab"}, CodeBadKeyword},
		{Request{Text: "平" + unknown}, CodeUnknownChar},
		{Request{Text: "年年", Mode: ModeAcrostic}, CodeSameHeads},
		{Request{Text: "年年"}, ""},
		{Request{Text: "平安", Length: 2}, CodeBadLength},
		{Request{Text: "平安", Length: 29}, CodeBadLength},
		{Request{Text: "平安", N: -1}, CodeBadN},
		{Request{Text: "平安", N: Limits.MaxN + 1}, CodeBadN},
		{Request{Text: "平安", Temperature: -1}, CodeBadSampling},
		{Request{Text: "平安", TopP: 1.5}, CodeBadSampling},
		{Request{Text: "平安", TopK: -2}, CodeBadSampling},
		{Request{Text: "\xff\xfe"}, CodeBadChar},
		{Request{Mode: ModeLower, Text: "春回大地"}, ""},
		{Request{Mode: ModeLower, Text: "春回大地,万象更新。"}, ""},
		{Request{Mode: ModeLower, Text: "春回大地A"}, CodeBadChar},
		{Request{Mode: ModeLower, Text: "，春回大地"}, CodeBadPunct},
		{Request{Mode: ModeLower, Text: "春回，，大地"}, CodeBadPunct},
		{Request{Mode: ModeLower, Text: "春回" + unknown}, CodeUnknownChar},
		{Request{Mode: ModeLower, Text: strings.Repeat("春", 33)}, CodeBadLength},
	} {
		err := g.Validate(c.req)
		var ie *InputError
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%+v: unexpected error %v", c.req, err)
		case c.code != "" && (!errors.As(err, &ie) || ie.Code != c.code):
			t.Errorf("%+v: got %v, want code %s", c.req, err, c.code)
		case ie != nil && !strings.Contains(ie.Message, " / "):
			t.Errorf("%+v: message %q is not bilingual", c.req, ie.Message)
		}
	}
}

// TestProcessorRules drives the constraint by hand on crafted histories.
func TestProcessorRules(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()})
	tb := g.t
	id := func(s string) int32 {
		i, ok := tb.charID([]rune(s)[0])
		if !ok {
			t.Fatalf("%s not in vocab", s)
		}
		return i
	}
	ids := func(s string) []int32 {
		var out []int32
		for _, r := range s {
			out = append(out, id(string(r)))
		}
		return out
	}
	allowed := func(c *constraint, gen []int32) (map[int32]bool, error) {
		row := make([]float32, tb.vocab.Size())
		err := c.Process(gen, row)
		out := map[int32]bool{}
		for i, v := range row {
			if v > negInf {
				out[int32(i)] = true
			}
		}
		return out, err
	}
	plan := func(req Request) *plan {
		p, err := tb.prepare(req, DefaultTemperature)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	sp := tb.sp
	only := func(a map[int32]bool, want int32) bool { return len(a) == 1 && a[want] }

	// Acrostic 平安, length 5.
	pa := plan(Request{Mode: ModeAcrostic, Text: "平安", Length: 5})
	ca := newConstraint(tb, pa)
	if a, _ := allowed(ca, nil); !only(a, id("平")) {
		t.Errorf("acrostic: U1 not forced to 平: %d allowed", len(a))
	}
	a, _ := allowed(ca, ids("平天"))
	for tok := range a {
		if tb.class[tok] != classHan {
			t.Errorf("upper slot allows non-Han %q", tb.vocab.Token(tok))
		}
	}
	a, _ = allowed(ca, ids("平天地人"))
	for tok := range a {
		if tb.tone[tok] != ToneZe {
			t.Errorf("upper last slot allows %q (%v)", tb.vocab.Token(tok), tb.tone[tok])
		}
	}
	upper := ids("平天平人乐")
	if a, _ = allowed(ca, upper); !only(a, sp.Sep) {
		t.Errorf("sep not forced after the 上联")
	}
	hist := append(append([]int32(nil), upper...), sp.Sep)
	if a, _ = allowed(ca, hist); !only(a, id("安")) {
		t.Errorf("acrostic: L1 not forced to 安")
	}
	hist = append(hist, id("安"))
	a, _ = allowed(ca, hist) // l[1]: ≠ u[1]=天, ≠ l[0]=安
	if a[id("天")] || a[id("安")] || len(a) == 0 {
		t.Errorf("lower slot 1 allows the same-position char or an earlier lower char")
	}
	hist = append(hist, id("地"))
	if a, _ = allowed(ca, hist); !only(a, id("安")) { // u[2]=平=u[0] → l[2]=l[0]
		t.Errorf("mirrored repetition not forced")
	}
	hist = append(hist, id("安"), id("人")) // l[3] = 人? It must differ from u[3]=人 — check it is forbidden
	if a, _ = allowed(ca, hist[:len(hist)-1]); a[id("人")] {
		t.Errorf("lower slot 3 allows the upper's char 人")
	}
	hist[len(hist)-1] = id("和")
	a, _ = allowed(ca, hist)
	for tok := range a {
		if tb.tone[tok] != TonePing || tok == id("乐") || tok == id("安") || tok == id("地") || tok == id("和") {
			t.Errorf("lower last slot allows %q", tb.vocab.Token(tok))
		}
	}
	hist = append(hist, id("春"))
	if a, _ = allowed(ca, hist); !only(a, sp.Banner) {
		t.Errorf("<ban> not forced after the 下联")
	}
	hist = append(hist, sp.Banner)
	for i := 0; i < 4; i++ {
		a, _ = allowed(ca, hist)
		for tok := range a {
			if tb.class[tok] != classHan {
				t.Errorf("banner slot allows %q", tb.vocab.Token(tok))
			}
		}
		hist = append(hist, id("福"))
	}
	if a, _ = allowed(ca, hist); !only(a, sp.EOS) {
		t.Errorf("<eos> not forced after the banner")
	}

	// Keyword: K2 forced after K1 at a valid start; K1 forced at deadline.
	pk := plan(Request{Text: "平安", Length: 5})
	ck := newConstraint(tb, pk)
	if a, _ = allowed(ck, ids("平")); !only(a, id("安")) {
		t.Errorf("keyword: K2 not forced after K1")
	}
	if ck.deadline < 0 || ck.deadline > 3 {
		t.Fatalf("keyword deadline %d", ck.deadline)
	}
	pre := ids("天地人和")[:ck.deadline]
	if a, _ = allowed(ck, pre); !only(a, id("平")) {
		t.Errorf("keyword: K1 not forced at the deadline %d", ck.deadline)
	}

	if a, _ = allowed(newConstraint(tb, pk, true), nil); !only(a, id("平")) {
		t.Errorf("keyword head-first: K1 not forced at the start")
	}

	// A keyword whose K2 is 仄 could end the 上联, but does not: the last
	// start leaves a slot after it, and K1 is not allowed at the end.
	pz := plan(Request{Text: "富贵", Length: 7})
	cz := newConstraint(tb, pz)
	if cz.deadline != 4 || cz.kwStart[5] {
		t.Errorf("富贵 in a 7-character 上联: deadline %d, start at the end %v; want 4, false", cz.deadline, cz.kwStart[5])
	}
	if a, _ = allowed(cz, ids("天地人和")); !only(a, id("富")) {
		t.Errorf("富贵: K1 not forced at slot 4")
	}
	if a, _ = allowed(cz, ids("天地人和春")); a[id("富")] {
		t.Errorf("富贵: K1 allowed at slot 5")
	}

	// A four-character phrase opens the 上联 in every sample, free or
	// head-first; the 下联 is free.
	pe := plan(Request{Text: "万事如意", Length: 7})
	for _, ce := range []*constraint{newConstraint(tb, pe), newConstraint(tb, pe, true)} {
		for k, r := range []rune("万事如意") {
			if a, _ = allowed(ce, ids("万事如意")[:k]); !only(a, id(string(r))) {
				t.Errorf("万事如意: %c not forced at slot %d", r, k)
			}
		}
		if a, _ = allowed(ce, ids("万事如意")); !a[id("顺")] || a[id("事")] || a[id("意")] {
			t.Errorf("万事如意, slot 4: 顺 %v, 事 %v, 意 %v allowed; want true, false, false", a[id("顺")], a[id("事")], a[id("意")])
		}
	}

	// Punctuation template: position 4 of a length-8 line is "，".
	p8 := plan(Request{Text: "平安", Length: 8})
	c8 := newConstraint(tb, p8)
	if a, _ = allowed(c8, ids("天地人和")); !only(a, id("，")) {
		t.Errorf("comma not forced in the 上联")
	}

	// Lower mode: upper fixed, lower last slot 平, and an upper char equal
	// to the last one needs 平 at its own slot too (lookahead).
	pl := plan(Request{Mode: ModeLower, Text: "月照人照月"})
	cl := newConstraint(tb, pl)
	a, _ = allowed(cl, nil)
	for tok := range a {
		if tb.tone[tok] != TonePing || tok == id("月") {
			t.Errorf("lower mode slot 0 (same char as the last) allows %q", tb.vocab.Token(tok))
		}
	}

	// A fully masked row reports a dead end.
	row := make([]float32, tb.vocab.Size())
	for i := range row {
		row[i] = negInf
	}
	if err := ca.Process(ids("平天"), row); !errors.Is(err, sampler.ErrDeadEnd) {
		t.Errorf("all-masked row: got %v, want ErrDeadEnd", err)
	}
}

// checkResult asserts the rules every returned couplet must satisfy.
func checkResult(t *testing.T, req Request, cs []Couplet) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range cs {
		r := Check(c.Upper, c.Lower, c.Banner)
		if !r.Rule1() || !r.Rule3() || !r.Rule4() || !r.LowerPing || (req.Mode != ModeLower && !r.UpperZe) {
			t.Errorf("%+v → %q/%q/%q breaks %v", req, c.Upper, c.Lower, c.Banner, r.Failed())
		}
		text := []rune(Normalize(req.Text))
		switch req.Mode {
		case ModeKeyword, "":
			if !ContainsKeyword(c, string(text)) {
				t.Errorf("keyword %s missing from %q/%q/%q", req.Text, c.Upper, c.Lower, c.Banner)
			}
			if n := len([]rune(c.Upper)); n != len(Layout(max(req.Length, MinLength))) && req.Length != 0 {
				t.Errorf("length %d: got %q", req.Length, c.Upper)
			}
		case ModeAcrostic:
			if []rune(c.Upper)[0] != text[0] || []rune(c.Lower)[0] != text[1] {
				t.Errorf("acrostic %s: %q/%q", req.Text, c.Upper, c.Lower)
			}
		case ModeLower:
			if c.Upper != string(text) {
				t.Errorf("lower mode changed the 上联: %q", c.Upper)
			}
		}
		if req.Mode != ModeLower {
			// The 上联 repeats a character only as one 叠字 right after
			// it, except where the keyword is forced onto a character
			// already written.
			u := []rune(c.Upper)
			for i, r := range u {
				if IsHan(r) && refEcho(u, i, r) && !slices.Contains(text, r) {
					t.Errorf("%+v → 上联 %q repeats %c", req, c.Upper, r)
				}
			}
		}
		if seen[c.Upper+c.Lower] {
			t.Errorf("duplicate candidate %q/%q", c.Upper, c.Lower)
		}
		seen[c.Upper+c.Lower] = true
	}
}

// TestPropertyFake: with an arbitrary (hash-random) model, every returned
// couplet is well formed, for many seeds, keywords, modes and lengths.
func TestPropertyFake(t *testing.T) {
	fe := &fakeEngine{vocab: testModel.Tok.Size()}
	g := newFakeGen(t, fe)
	kws := usableKeywords(t, g)
	lengths := []int{0, 3, 5, 7, 8, 9, 11, 14}
	uppers := []string{"春回大地", "天增岁月人增寿", "月照人照月", "春风入户，福气满门", "喜"}
	ctx := context.Background()
	for seed := uint64(1); seed <= 60; seed++ {
		var req Request
		switch seed % 3 {
		case 0:
			req = Request{Mode: ModeKeyword, Text: kws[int(seed)%len(kws)], Length: lengths[int(seed)%len(lengths)], N: 1 + int(seed)%3, Seed: seed}
		case 1:
			req = Request{Mode: ModeAcrostic, Text: kws[int(seed)%len(kws)], Length: lengths[int(seed/2)%len(lengths)], N: 2, Seed: seed}
		case 2:
			req = Request{Mode: ModeLower, Text: uppers[int(seed)%len(uppers)], N: 1, Seed: seed}
		}
		if g.Validate(req) != nil {
			continue
		}
		cs, err := g.Generate(ctx, req)
		if err != nil {
			t.Fatalf("%+v: %v", req, err)
		}
		if len(cs) == 0 || len(cs) > max(req.N, 1) {
			t.Fatalf("%+v: %d couplets", req, len(cs))
		}
		checkResult(t, req, cs)
	}
}

// TestImpossibleConstraint: when a rule can never be met (here an extra
// processor forbids every 平 character, so no 下联 can end on 平) Generate
// returns ErrNoCouplet after its bounded attempts instead of hanging.
func TestImpossibleConstraint(t *testing.T) {
	tbl := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()}).t
	noPing := sampler.LogitsProcessorFunc(func(_ []int32, l []float32) error {
		for i := range l {
			if i < len(tbl.tone) && tbl.tone[i] == TonePing {
				l[i] = negInf
			}
		}
		return nil
	})
	fe := &fakeEngine{vocab: testModel.Tok.Size(), extra: noPing}
	g := newFakeGen(t, fe, WithMaxAttempts(3))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := g.Generate(ctx, Request{Text: "平安", N: 2, Seed: 5})
	if !errors.Is(err, ErrNoCouplet) {
		t.Fatalf("got %v, want ErrNoCouplet", err)
	}
	if fe.genCalls != 3 {
		t.Errorf("%d generation rounds, want 3 (the attempt budget)", fe.genCalls)
	}
}

func TestUnconstrainedParses(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()})
	cs, err := g.Generate(context.Background(), Request{Text: "平安", N: 3, Seed: 9, Unconstrained: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 3 {
		t.Fatalf("%d couplets, want 3", len(cs))
	}
	bad := 0
	for _, c := range cs {
		if !Check(c.Upper, c.Lower, c.Banner).OK() {
			bad++
		}
	}
	// A hash-random model almost never writes a valid couplet on its own:
	// this is what the constraints are for.
	if bad == 0 {
		t.Errorf("random model produced 3 valid couplets unconstrained: %+v", cs)
	}
}

// TestBannerRanking: the returned 横批 is the best by log P(B1..B4 |
// couplet) among the model's own and the k pool candidates whose first
// character is likeliest after <ban>; all scores are recomputed here
// independently (prompt log-probs of the whole text on the fake engine).
func TestBannerRanking(t *testing.T) {
	for _, k := range []int{0, 1, 2, 4, 10} {
		t.Run(fmt.Sprint("k=", k), func(t *testing.T) {
			fe := &fakeEngine{vocab: testModel.Tok.Size()}
			g := newFakeGen(t, fe, WithBannerTopK(k))
			cs, err := g.Generate(context.Background(), Request{Text: "平安", N: 2, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			// One sampling round plus one 横批 request per couplet.
			if fe.genCalls != 1+len(cs) {
				t.Errorf("%d engine calls for %d couplets; want 1 + one 横批 request each", fe.genCalls, len(cs))
			}
			p, _ := g.t.prepare(Request{Text: "平安"}, DefaultTemperature)
			for _, c := range cs {
				full := append(g.prompt(p), charIDs(t, g, c.Upper)...)
				full = append(full, g.t.sp.Sep)
				full = append(full, charIDs(t, g, c.Lower)...)
				full = append(full, g.t.sp.Banner)
				score := func(b string) float64 {
					seq := append(slices.Clone(full), charIDs(t, g, b)...)
					res, _ := fe.Generate(context.Background(), &engine.Request{Prompt: seq, PromptLogProbs: true})
					s := 0.0
					for _, v := range res.PromptLogProbs[len(seq)-5:] {
						s += float64(v)
					}
					return s
				}
				// The candidates the model had to beat: top k of the pool
				// by the logit of the first character at <ban>.
				row := fe.row(full)
				pool := topBanners(g.banners, newBannerContext("平安"+c.Upper+c.Lower), DefaultBannerPool)
				sort.SliceStable(pool, func(i, j int) bool { return row[pool[i].ids[0]] > row[pool[j].ids[0]] })
				rivals := pool[:min(k, len(pool))]
				chosen := score(c.Banner)
				for _, b := range rivals {
					if s := score(b.text); s > chosen+1e-6 {
						t.Errorf("banner %s scores %.3f > chosen %s %.3f", b.text, s, c.Banner, chosen)
					}
				}
				if len([]rune(c.Banner)) != 4 {
					t.Errorf("banner %q is not four characters", c.Banner)
				}
			}
		})
	}
}

// TestAssignByFirstChar: the forced 横批 samples get the k candidates whose
// first character has the highest logit, ties in pool order, impossible
// first characters skipped.
func TestAssignByFirstChar(t *testing.T) {
	mk := func(ids ...int32) *bannerCand { return &bannerCand{ids: [4]int32{ids[0], 9, 9, 9}} }
	ninf := float32(math.Inf(-1))
	row := []float32{0, 5, 3, 3, ninf, 1} // [vocab 6]
	pool := []*bannerCand{mk(0), mk(2), mk(4), mk(1), mk(3), mk(5)}
	for _, c := range []struct {
		k    int
		want []int32 // first ids, in order
	}{
		{0, []int32{}},
		{1, []int32{1}},
		{3, []int32{1, 2, 3}},
		{5, []int32{1, 2, 3, 5, 0}},
		{9, []int32{1, 2, 3, 5, 0}}, // 4 is -Inf: never assigned
	} {
		got := []int32{}
		for _, ids := range assignByFirstChar(pool, row, c.k) {
			got = append(got, ids[0])
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("k=%d: got %v, want %v", c.k, got, c.want)
		}
	}
}

func TestText(t *testing.T) {
	c := Couplet{Upper: "天增岁月人增寿", Lower: "春满乾坤福满门", Banner: "四季长安"}
	want := "上联：天增岁月人增寿\n下联：春满乾坤福满门\n横批：四季长安"
	if c.Text() != want {
		t.Errorf("Text() = %q", c.Text())
	}
}

func TestStreaming(t *testing.T) {
	t.Run("fake", func(t *testing.T) { testStreaming(t, &fakeEngine{vocab: testModel.Tok.Size()}) })
	t.Run("paged", func(t *testing.T) { testStreaming(t, realStack(t, testModel)) })
}

func testStreaming(t *testing.T, e engine.Engine) {
	g := newFakeGen(t, e)
	var mu sync.Mutex // OnToken runs on the engine goroutine
	var got = map[string]string{}
	cs, err := g.Generate(context.Background(), Request{Text: "平安", Seed: 11, OnToken: func(ev TokenEvent) {
		key := fmt.Sprintf("%d/%d/%s", ev.Attempt, ev.Sample, ev.Part)
		mu.Lock()
		got[key] += ev.Text
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for k, v := range got {
		if strings.HasSuffix(k, "/upper") && v == cs[0].Upper {
			found = true
		}
	}
	if !found {
		t.Errorf("streamed pieces %v do not contain the returned 上联 %q", got, cs[0].Upper)
	}
}

// Normalize converts traditional characters to simplified and strips
// zero-width characters, identically for every interface.
func TestNormalizeTraditionalAndZeroWidth(t *testing.T) {
	for in, want := range map[string]string{
		"福壽":             "福寿",
		"萬事如意":           "万事如意",
		"國泰民安":           "国泰民安",
		"乾坤":             "乾坤",
		"平\u200b安":       "平安",
		"\ufeff平安\u2060": "平安",
		"平安":             "平安",
	} {
		if got := Normalize(in); got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestIsPunct: IsPunct is exactly the runes of Punctuation.
func TestIsPunct(t *testing.T) {
	for _, r := range Punctuation {
		if !IsPunct(r) {
			t.Errorf("IsPunct(%c) = false", r)
		}
	}
	for _, r := range "春,.;:!?。「」 a0\u00b6\u30fb" {
		if IsPunct(r) != strings.ContainsRune(Punctuation, r) {
			t.Errorf("IsPunct(%c) = %v", r, IsPunct(r))
		}
	}
}

// TestStyleEngine: with WithStyleEngine the blessing-word modes run every
// engine request (candidates and 横批) on the style engine and lower mode
// on New's engine; the other engine sees no request.
func TestStyleEngine(t *testing.T) {
	for _, tc := range []struct {
		req       Request
		wantStyle bool
	}{
		{Request{Text: "平安", Seed: 1}, true},
		{Request{Mode: ModeAcrostic, Text: "春福", Seed: 2}, true},
		{Request{Mode: ModeLower, Text: "春回大地", Seed: 3}, false},
	} {
		base := &fakeEngine{vocab: testModel.Tok.Size()}
		style := &fakeEngine{vocab: testModel.Tok.Size()}
		g := newFakeGen(t, base, WithStyleEngine(style))
		if _, err := g.Generate(context.Background(), tc.req); err != nil {
			t.Fatalf("%s %q: %v", tc.req.Mode, tc.req.Text, err)
		}
		used, idle := base, style
		if tc.wantStyle {
			used, idle = style, base
		}
		if used.genCalls == 0 || idle.genCalls+idle.scoreCalls != 0 {
			t.Errorf("%s %q: wanted engine %d generate calls, other engine %d generate + %d score calls",
				tc.req.Mode, tc.req.Text, used.genCalls, idle.genCalls, idle.scoreCalls)
		}
	}
}
