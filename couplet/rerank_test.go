package couplet

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"chunlian/bench"
	"chunlian/critic"
	"chunlian/engine"
	"chunlian/model"
)

func TestRepeats(t *testing.T) {
	for _, tc := range []struct {
		u, l string
		want int
	}{
		{"春回大地千山秀", "福满人间万户新", 0},
		{"平安竹报平安喜", "吉祥花开吉祥春", 4}, // mirrored echoes: 平 安 / 吉 祥, once per line
		{"喜气盈门增喜气", "春风拂面暖春风", 4},
		{"年年如意春常在", "岁岁平安福永存", 0}, // adjacent mirrored repeats (叠字) are a figure
		{"耕耘蜜果陶甜蜜", "收获农桑享幸福", 1}, // 蜜 repeated, 下联 not
		{"福寿寿寿寿昌久", "国富富富富和谐", 4}, // third and fourth occurrences, both lines
		{"国泰民安山河壮", "民安物阜岁月新", 2}, // 民安 of the 下联 stands in the 上联
		{"春风", "春风吹", 0},          // unequal lengths: not scored
	} {
		if got := repeats(tc.u, tc.l); got != tc.want {
			t.Errorf("repeats(%s, %s) = %d, want %d", tc.u, tc.l, got, tc.want)
		}
	}
}

func TestWeightsScore(t *testing.T) {
	w := Weights{LogProb: 1, Tone: 2, POS: 3, Festive: 4, Reverse: 5, Bad: 6, Repeated: 7, Heads: 8, Unpaired: 9}
	f := Features{LogProb: -1, Tone: 0.5, POS: 0.5, Festive: 0.25, Reverse: -2, Bad: 1, Repeated: 2, Heads: 2, Unpaired: 1}
	want := -1 + 1 + 1.5 + 1 - 10 - 6 - 14 - 16 - 9.0
	if got := w.Score(f); got != want {
		t.Fatalf("Score = %v, want %v", got, want)
	}
	// An unsuitable word costs more than any plausible log-prob gap.
	good := Features{LogProb: -2.5}
	bad := Features{LogProb: -1, Bad: 1}
	if DefaultWeights.Score(bad) >= DefaultWeights.Score(good) {
		t.Fatalf("default weights rank a couplet with an unsuitable word above a clean one")
	}
}

// headJudge is allJudge (nothing unsuitable) whose OpensWord is false
// for lines that start with a character of noWord.
type headJudge struct {
	allJudge
	noWord string
}

func (j headJudge) OpensWord(line string) bool {
	return line != "" && !strings.ContainsRune(j.noWord, []rune(line)[0])
}

// Heads counts acrostic lines whose head opens no word, in acrostic mode
// only, and costs a candidate DefaultWeights.Heads per line.
func TestHeadsFeature(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()}, WithJudge(headJudge{noWord: "安"}))
	cd := testCandidate(t, g, "平春风暖日", "安瑞雪迎新", -1)
	for _, tc := range []struct {
		mode Mode
		want int
	}{{ModeAcrostic, 1}, {ModeKeyword, 0}} {
		p, err := g.t.prepare(Request{Text: "平安", Mode: tc.mode}, DefaultTemperature)
		if err != nil {
			t.Fatal(err)
		}
		if got := g.features(p, cd).Heads; got != tc.want {
			t.Errorf("%s mode: Heads = %d, want %d", tc.mode, got, tc.want)
		}
	}
	if got := headsOpenNoWord("安平", "安和", headJudge{noWord: "安"}); got != 2 {
		t.Errorf("headsOpenNoWord = %d, want 2", got)
	}
	if got := headsOpenNoWord("安平", "安和", nil); got != 0 {
		t.Errorf("headsOpenNoWord without a judge = %d, want 0", got)
	}
	if DefaultWeights.Score(Features{LogProb: -1, Heads: 1}) >= DefaultWeights.Score(Features{LogProb: -1}) {
		t.Error("a head that opens no word costs nothing by default")
	}
}

// A blessing word holding an ill-omened word is refused in keyword and
// acrostic mode, before any engine request, with its own code; lower mode
// (a given 上联), the words visitors type and the 横批 list are not.
func TestTabooWordRefused(t *testing.T) {
	fe := &fakeEngine{vocab: testModel.Tok.Size()}
	g := newFakeGen(t, fe, WithJudge(critic.Judge{}))
	for _, req := range []Request{
		{Text: "死亡"},
		{Text: "死"},
		{Text: "病痛", Mode: ModeKeyword},
		{Text: "離婚"}, // traditional: normalised first
		{Text: "哭笑", Mode: ModeAcrostic},
		{Text: "春风一度"},
	} {
		_, err := g.Generate(context.Background(), req)
		var ie *InputError
		if !errors.As(err, &ie) || ie.Code != CodeTabooWord {
			t.Errorf("%+v: err %v, want code %s", req, err, CodeTabooWord)
			continue
		}
		if err := g.Validate(req); err == nil {
			t.Errorf("%+v: Validate passes what Generate refuses", req)
		}
	}
	fe.mu.Lock()
	if n := fe.genCalls + fe.scoreCalls; n != 0 {
		t.Errorf("%d engine requests for refused words", n)
	}
	fe.mu.Unlock()
	for _, req := range []Request{
		{Text: "平安"},
		{Text: "兴亡"}, // 亡 masked by the exception 兴亡
		{Text: "秋高气爽"},
		{Text: "生死难忘天地久", Mode: ModeLower},
	} {
		// The test model lacks some of these characters: only the
		// taboo refusal is checked.
		var ie *InputError
		if err := g.Validate(req); errors.As(err, &ie) && ie.Code == CodeTabooWord {
			t.Errorf("%+v refused: %v", req, err)
		}
	}
	words := append(slices.Clone(bench.BlessingWords), BannerList()...)
	for _, w := range g.t.singles {
		words = append(words, w)
	}
	for _, w := range words {
		if tw := (critic.Judge{}).Taboo(w); len(tw) > 0 {
			t.Errorf("blessing word %s would be refused (%s)", w, strings.Join(tw, ","))
		}
	}
}

// Unpaired marks, in four-character phrase mode only, a 下联 that does
// not open with a phrase of the 横批 list, and costs a candidate
// DefaultWeights.Unpaired.
func TestUnpairedFeature(t *testing.T) {
	g := newFakeGen(t, &fakeEngine{vocab: testModel.Tok.Size()}, WithJudge(allJudge{}))
	for _, tc := range []struct {
		text, upper, lower string
		want               int
	}{
		{"万事如意", "万事如意春满门", "国泰民安福在门", 0}, // 国泰民安 is on the test list
		{"万事如意", "万事如意春满门", "国安民泰福在门", 1},
		{"平安", "平安吉祥春满门", "国安民泰福在门", 0}, // not phrase mode
	} {
		p, err := g.t.prepare(Request{Text: tc.text, Mode: ModeKeyword}, DefaultTemperature)
		if err != nil {
			t.Fatal(err)
		}
		cd := testCandidate(t, g, tc.upper, tc.lower, -1)
		if got := g.features(p, cd).Unpaired; got != tc.want {
			t.Errorf("%s: %s / %s: Unpaired = %d, want %d", tc.text, tc.upper, tc.lower, got, tc.want)
		}
	}
	if !g.opensWithPhrase("国泰民安") || g.opensWithPhrase("国泰民") {
		t.Error("opensWithPhrase: a whole phrase, or only its first three characters, misread")
	}
	if DefaultWeights.Score(Features{LogProb: -1, Unpaired: 1}) >= DefaultWeights.Score(Features{LogProb: -1}) {
		t.Error("an unpaired 下联 costs nothing by default")
	}
}

func TestContainsKeyword(t *testing.T) {
	if !ContainsKeyword(Couplet{Upper: "万事如意家业旺", Lower: "一帆风顺福满堂"}, "万事如意") {
		t.Error("phrase opening the 上联 not found")
	}
	if ContainsKeyword(Couplet{Upper: "万事顺心家业旺", Lower: "如意吉祥福满堂"}, "万事如意") {
		t.Error("phrase found though it is split over the lines")
	}
	if !ContainsKeyword(Couplet{Upper: "五福临门家业旺", Lower: "三阳开泰户庭新"}, "福") {
		t.Error("one-character keyword not found")
	}
}

// TestKeywordBreadth: one- and four-character keywords generate couplets
// that carry them (fake engine: the rules, not the model, are under test).
func TestKeywordBreadth(t *testing.T) {
	fe := &fakeEngine{vocab: testModel.Tok.Size()}
	g := newFakeGen(t, fe, WithBanners("五福临门", "福满人间", "万象更新"))
	if w := g.t.singles['福']; w != "五福" {
		t.Fatalf("single word for 福 = %q, want 五福 (first of the most frequent halves)", w)
	}
	// A judge that reads 五福 as no word: the half it does read wins,
	// though it is less frequent (福满 of 福满人间 once, 五福 once but first).
	words := singleWords(g.banners, headJudge{noWord: "五"})
	if w := words['福']; w != "福满" {
		t.Errorf("with a judge that rejects 五福: single word for 福 = %q, want 福满", w)
	}
	for _, text := range []string{"福", "万事如意", "年年有余", "平安"} {
		req := Request{Text: text, N: 2, Seed: 3}
		cs, err := g.Generate(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", text, err)
		}
		checkResult(t, req, cs)
		if len([]rune(text)) == 4 {
			for _, c := range cs {
				if !strings.HasPrefix(c.Upper, text) {
					t.Errorf("%s does not open the 上联: %s / %s", text, c.Upper, c.Lower)
				}
			}
		}
	}
	if err := g.Validate(Request{Text: "龘"}); err == nil {
		t.Error("a character with no known word was accepted")
	}
	if err := g.Validate(Request{Text: "一二三"}); err == nil {
		t.Error("three characters were accepted")
	}
	if err := g.Validate(Request{Text: "万事如意", Length: 4}); err == nil {
		t.Error("a four-character phrase was accepted for 4-character lines")
	}
}

// TestExplainListsCandidates: Trace.Explain lists every candidate with its
// features, best first, the returned ones marked, and the reverse score
// filled in.
func TestExplainListsCandidates(t *testing.T) {
	fe := &fakeEngine{vocab: testModel.Tok.Size()}
	g := newFakeGen(t, fe, WithOversample(4))
	tr := &Trace{Explain: true}
	cs, err := g.Generate(context.Background(), Request{Text: "平安", N: 2, Seed: 5, Trace: tr})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Candidates) < len(cs) {
		t.Fatalf("%d candidates listed for %d returned", len(tr.Candidates), len(cs))
	}
	chosen := 0
	for i, c := range tr.Candidates {
		if i > 0 && c.Score > tr.Candidates[i-1].Score {
			t.Fatalf("candidates not sorted by score")
		}
		if c.Features.Reverse >= 0 {
			t.Errorf("candidate %d: reverse log-prob %v not computed", i, c.Features.Reverse)
		}
		if c.Chosen {
			chosen++
		}
	}
	if chosen != len(cs) {
		t.Fatalf("%d marked chosen, %d returned", chosen, len(cs))
	}
}

// TestBannerList: the embedded 横批 list is four Chinese characters a
// line, without duplicates, every character known to the model, and
// nothing the critic calls unsuitable.
func TestBannerList(t *testing.T) {
	list := BannerList()
	if len(list) < 200 {
		t.Fatalf("only %d phrases", len(list))
	}
	m, err := model.Default()
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(m, &fakeEngine{vocab: m.Tok.Size()})
	if err != nil {
		t.Fatal(err)
	}
	tabs := g.t
	if g.NumBanners() != len(list) {
		t.Errorf("the shipped model can write %d of the %d phrases", g.NumBanners(), len(list))
	}
	seen := map[string]bool{}
	for _, b := range list {
		rs := []rune(b)
		if len(rs) != 4 {
			t.Errorf("%q: not four characters", b)
		}
		for _, r := range rs {
			if _, ok := tabs.charID(r); !ok || !IsHan(r) {
				t.Errorf("%q: %q unknown to the model or not Chinese", b, r)
			}
		}
		if seen[b] {
			t.Errorf("%q twice", b)
		}
		seen[b] = true
		if critic.UnsuitableBanner(b) || len(critic.Unsuitable(b)) > 0 {
			t.Errorf("%q is flagged by the critic", b)
		}
	}
	for _, bad := range []string{"春风一度", "富贵在天", "如花似玉", "风和日美", "安家乐业", "民泰国安", "国强富民"} {
		if seen[bad] {
			t.Errorf("%q must not be a 横批", bad)
		}
	}
}

// TestSelectionTemperature: with τ = 0 the best-scored candidate always
// wins; with the default τ a clearly better candidate still wins almost
// always, and near-ties are shared between requests of different seeds.
func TestSelectionTemperature(t *testing.T) {
	count := func(tau float64, gap float64) int {
		wins := 0
		for seed := uint64(1); seed <= 400; seed++ {
			r := rand.New(rand.NewPCG(seed, 0x5E1EC7))
			a, b := 0.0+tau*gumbel(r), -gap+tau*gumbel(r)
			if a > b {
				wins++
			}
		}
		return wins
	}
	if w := count(0, 0.01); w != 400 {
		t.Errorf("τ = 0: the better candidate won %d of 400", w)
	}
	if w := count(DefaultSelectionTemperature, 0.5); w < 390 {
		t.Errorf("default τ, gap 0.5: the better candidate won only %d of 400", w)
	}
	if w := count(DefaultSelectionTemperature, 0.02); w > 300 || w < 200 {
		t.Errorf("default τ, gap 0.02: the better candidate won %d of 400, want a near-even split", w)
	}
}

// samplesEngine records the sample count of each candidate request (the
// first request of a Generate call, with a processor per sample).
type samplesEngine struct {
	engine.Engine
	mu sync.Mutex
	n  []int
}

func (s *samplesEngine) Generate(ctx context.Context, r *engine.Request) (*engine.Result, error) {
	if r.NewProcessor != nil && r.Params.MaxTokens > 4 {
		s.mu.Lock()
		s.n = append(s.n, r.Params.N)
		s.mu.Unlock()
	}
	return s.Engine.Generate(ctx, r)
}

// TestIdleSamples: an unseeded request draws the idle sample count while
// few calls are under way; a seeded one, or one past the bound, the
// oversample.
func TestIdleSamples(t *testing.T) {
	se := &samplesEngine{Engine: &fakeEngine{vocab: testModel.Tok.Size()}}
	g := newFakeGen(t, se, WithOversample(3), WithIdleSamples(6, 1))
	for _, req := range []Request{{Text: "平安"}, {Text: "平安", Seed: 5}} {
		if _, err := g.Generate(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	g.inflight.Add(1) // another call under way: past the bound
	if _, err := g.Generate(context.Background(), Request{Text: "平安"}); err != nil {
		t.Fatal(err)
	}
	g.inflight.Add(-1)
	if want := []int{6, 3, 3}; !slices.Equal(se.n[:3], want) {
		t.Errorf("samples per candidate request %v, want %v (idle unseeded, seeded, busy)", se.n, want)
	}
}

// BenchmarkTextFeatures is the ranking's reader-side work for one
// candidate, with the served judge (year check on).
func BenchmarkTextFeatures(b *testing.B) {
	j := critic.Judge{Year: 2027}
	critic.Load()
	pairs := [][2]string{
		{"春回大地千山秀", "日照神州万木荣"}, {"门纳平安开泰运", "户迎富贵纳祯祥"},
		{"金蛇辞岁千家乐", "骏马迎春万户欢"}, {"天增岁月人增寿", "春满乾坤福满门"},
		{"一帆风顺年年好", "万事如意步步高"}, {"新春柳绿千山绿", "盛世花红万户红"},
		{"吉祥如意家家乐", "富贵平安岁岁欢"}, {"爆竹声中辞旧岁", "梅花香里报新春"},
	}
	for i := 0; b.Loop(); i++ {
		p := pairs[i%len(pairs)]
		TextFeatures(p[0], p[1], -1, j)
	}
}
