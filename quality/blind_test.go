package quality

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sampleCouplets() (ours, human []Couplet) {
	ours = []Couplet{
		{SourceOurs, "平安", "门纳平安开泰运", "户迎富贵纳祯祥", "吉星高照"},
		{SourceOurs, "新春", "新春柳绿千山绿", "盛世花红万户红", "春满人间"},
		{SourceOurs, "富贵", "香自大同谁富贵", "山因直至士从容", "富贵在天"},
	}
	human = []Couplet{
		{SourceHuman, "平安", "天增岁月人增寿", "春满乾坤福满楼", "四季长安"},
		{SourceHuman, "新春", "五湖四海皆春色", "万水千山尽得辉", ""},
		{SourceHuman, "富贵", "万事如意展宏图", "心想事成兴伟业", "五福临门"},
	}
	return
}

// fill marks every row of sheet with verdict(source) and banner y
// (n/a where no 横批 is shown), using key to know each row's side.
func fill(t *testing.T, sheet, key string, verdict map[string]string) string {
	src := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(key), "\n")[1:] {
		f := strings.Split(l, "\t")
		src[f[0]] = f[1]
	}
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSuffix(sheet, "\n"), "\n") {
		f := strings.Split(l, "\t")
		if strings.HasPrefix(l, "#") || f[0] == "id" {
			b.WriteString(l + "\n")
			continue
		}
		if len(f) != 6 || f[4] != "" {
			t.Fatalf("unfilled row %q: want 6 fields, verdict empty", l)
		}
		f[4] = verdict[src[f[0]]]
		if f[3] != BannerNA {
			f[5] = "y"
		}
		b.WriteString(strings.Join(f, "\t") + "\n")
	}
	return b.String()
}

func TestBlindSheetRoundTrip(t *testing.T) {
	ours, human := sampleCouplets()
	var sheet, key bytes.Buffer
	if err := WriteBlindSheet(&sheet, &key, ours, human, 7); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sheet.String(), SourceOurs) || strings.Contains(sheet.String(), SourceHuman) {
		t.Fatal("the sheet names a source")
	}
	// One human couplet has no 横批, so exactly one of ours hides its own.
	if n := strings.Count(sheet.String(), "\t"+BannerNA+"\t"); n != 2 {
		t.Errorf("%d rows with the 横批 hidden, want 2 (one per side)", n)
	}
	var sheet2, key2 bytes.Buffer
	WriteBlindSheet(&sheet2, &key2, ours, human, 7)
	if sheet.String() != sheet2.String() || key.String() != key2.String() {
		t.Error("the same seed wrote a different sheet")
	}
	filled := fill(t, sheet.String(), key.String(), map[string]string{SourceOurs: "o", SourceHuman: "h"})
	scores, err := ScoreSheet(strings.NewReader(filled), strings.NewReader(key.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(scores) != 2 || scores[0].Source != SourceOurs || scores[1].Source != SourceHuman {
		t.Fatalf("sides %+v", scores)
	}
	o, h := scores[0], scores[1]
	if o.N != 3 || o.Odd != 3 || o.Hang != 0 || o.BannerRows != 2 || o.BannerFits != 2 {
		t.Errorf("ours %+v, want 3 odd, 2 of 2 banners fit", o)
	}
	if h.N != 3 || h.Hang != 3 || h.BannerRows != 2 {
		t.Errorf("human %+v, want 3 hang, 2 banners", h)
	}
	if math.Abs(o.OddCI[0]-0.438503) > 1e-4 || o.OddCI[1] != 1 {
		t.Errorf("3/3 odd interval %v, want 0.4385–1", o.OddCI)
	}
	var out bytes.Buffer
	WriteScores(&out, scores)
	if !strings.Contains(out.String(), "3/3 = 100 %") {
		t.Errorf("report lacks 3/3:\n%s", out.String())
	}
}

func TestScoreSheetErrorsNameTheLine(t *testing.T) {
	key := "id\tsource\tword\n1\tchunlian\t平安\n2\thuman\t平安\n"
	cases := map[string]string{
		"id\t上联\t下联\t横批\tverdict\tbanner\n1\t甲\t乙\t丙丁戊己\t\ty\n2\t甲\t乙\tn/a\th\tn/a\n":  "sheet line 2 (id 1): no verdict",
		"id\t上联\t下联\t横批\tverdict\tbanner\n1\t甲\t乙\t丙丁戊己\tx\ty\n2\t甲\t乙\tn/a\th\tn/a\n": "sheet line 2 (id 1): verdict \"x\"",
		"id\t上联\t下联\t横批\tverdict\tbanner\n1\t甲\t乙\t丙丁戊己\th\t\n2\t甲\t乙\tn/a\th\tn/a\n":  "sheet line 2 (id 1): no banner mark",
		"id\t上联\t下联\t横批\tverdict\tbanner\n1\t甲\t乙\t丙丁戊己\th\ty\n9\t甲\t乙\tn/a\th\tn/a\n": "sheet line 3: id \"9\" is not in the key",
		"id\t上联\t下联\t横批\tverdict\tbanner\n1\t甲\t乙\t丙丁戊己\th\ty\n":                       "key id 2 has no row",
	}
	for sheet, want := range cases {
		_, err := ScoreSheet(strings.NewReader(sheet), strings.NewReader(key))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want one containing %q", err, want)
		}
	}
}

func TestWilson(t *testing.T) {
	// Values from the closed form with z = 1.959963984540054, computed
	// outside Go.
	for _, c := range []struct {
		k, n   int
		lo, hi float64
	}{{5, 10, 0.236593, 0.763407}, {0, 10, 0, 0.277533}, {12, 20, 0.386582, 0.781193}, {1, 3, 0.061492, 0.79234}} {
		got := Wilson(c.k, c.n, 0.95)
		if math.Abs(got[0]-c.lo) > 1e-5 || math.Abs(got[1]-c.hi) > 1e-5 {
			t.Errorf("Wilson(%d, %d) = %v, want %.6f–%.6f", c.k, c.n, got, c.lo, c.hi)
		}
	}
	if got := Wilson(0, 0, 0.95); got != [2]float64{} {
		t.Errorf("Wilson(0, 0) = %v", got)
	}
}

func TestHumanFor(t *testing.T) {
	pool := []Couplet{
		{Source: SourceHuman, Upper: "平安二字值千金", Lower: "和顺一门有百福"},
		{Source: SourceHuman, Upper: "岁岁平安福满门", Lower: "年年如意春盈室", Banner: "四季平安"},
		{Source: SourceHuman, Upper: "平安", Lower: "吉庆"},
		{Source: SourceHuman, Upper: "春风得意马蹄疾", Lower: "旭日临门瑞气浓"},
	}
	got := HumanFor(pool, "平安", 7, 5, rand.New(rand.NewPCG(1, 2)))
	if len(got) != 2 || got[0].Banner != "四季平安" || got[0].Word != "平安" {
		t.Errorf("HumanFor = %+v, want the triple first, then the other 7-character pair", got)
	}
}

func TestReadHumanSwapsReversedLines(t *testing.T) {
	dir := t.TempDir()
	wb, pairs := dir+"/wb.tsv", dir+"/pairs.tsv"
	// 春满乾坤福满楼 ends on 平 (楼), 天增岁月人增寿 on 仄 (寿): reversed here.
	os.WriteFile(wb, []byte("春满乾坤福满楼\t天增岁月人增寿\t四季长安\n"), 0o644)
	os.WriteFile(pairs, []byte("天增岁月人增寿\t春满乾坤福满楼\n晚风摇树树还挺\t晨露润花花更红\n"), 0o644)
	cs, err := ReadHuman(wb, pairs)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].Upper != "天增岁月人增寿" || cs[0].Banner != "四季长安" || cs[1].Banner != "" {
		t.Errorf("ReadHuman = %+v", cs)
	}
}

func TestDistinct2(t *testing.T) {
	// 春风春风: bigrams 春风 风春 春风 → 2 distinct of 3; 福到: 1 of 1.
	if got := Distinct2([]string{"春风春风", "福到"}); math.Abs(got-0.75) > 1e-12 {
		t.Errorf("Distinct2 = %v, want 3/4", got)
	}
	if got := Distinct2([]string{"福"}); got != 0 {
		t.Errorf("Distinct2 of one character = %v", got)
	}
}

func TestOverlap(t *testing.T) {
	if got := Overlap("春满人间", "新春柳绿千山绿盛世花红万户红"); got != 0.25 {
		t.Errorf("Overlap = %v, want 1/4", got)
	}
}

func TestComputeSignals(t *testing.T) {
	ours, human := sampleCouplets()
	ours = append(ours, Couplet{SourceOurs, "平安", "离别愁绪千般苦", "欢聚亲情万里长", "一路平安"})
	real := func(b string) bool { return b == "吉星高照" || b == "春满人间" }
	train := map[string]bool{"门纳平安开泰运\t户迎富贵纳祯祥": true}
	s := ComputeSignals(SourceOurs, ours, real, train)
	if s.N != 4 || s.Banners != 4 {
		t.Fatalf("%+v", s)
	}
	if s.Unsuitable != 0.5 || s.UnsuitableAdded != 0.5 {
		t.Errorf("unsuitable share %v (added %v), want 2/4 (谁 of the rhetorical question; 离别, 愁)", s.Unsuitable, s.UnsuitableAdded)
	}
	// A word the visitor typed does not count as added; one the writer
	// put beside it does.
	typed := []Couplet{
		{SourceOurs, "秋高气爽", "秋高气爽迎新岁", "国泰民安庆有余", ""},
		{SourceOurs, "秋高气爽", "秋高气爽迎新岁", "离愁别绪满心头", ""},
		{SourceOurs, "春花秋月", "春花秋月今宵好", "玉宇琼楼此夜明", ""},
	}
	if k := ComputeSignals(SourceOurs, typed, nil, nil); math.Abs(k.Unsuitable-1) > 1e-12 || math.Abs(k.UnsuitableAdded-1.0/3) > 1e-12 {
		t.Errorf("typed words: unsuitable %v, added %v; want 1 and 1/3", k.Unsuitable, k.UnsuitableAdded)
	}
	if s.BannerReal != 0.5 || s.BannerUnsuitable != 0.5 { // 富贵在天, 一路平安
		t.Errorf("banner real %v unsuitable %v, want 1/2 and 1/2", s.BannerReal, s.BannerUnsuitable)
	}
	if s.Copied != 0.25 {
		t.Errorf("copied %v, want 1/4", s.Copied)
	}
	if s.Distinct2Per != 4.0/3 || s.Parallelism <= 0 || s.Parallelism > 1 {
		t.Errorf("distinct-2 per word %v, parallelism %v", s.Distinct2Per, s.Parallelism)
	}
	h := ComputeSignals(SourceHuman, human, nil, nil)
	if h.BannerReal != -1 || h.Copied != -1 || h.Banners != 2 {
		t.Errorf("human without real-banner func or training pairs: %+v", h)
	}
	var b strings.Builder
	WriteSignals(&b, []Signals{s, h})
	if !strings.Contains(b.String(), "| with an unsuitable word | 50.0 % | 0.0 % |") {
		t.Errorf("report:\n%s", b.String())
	}
}

// TestFreshWords: words the readings name (two- or four-character runs
// anywhere in their files) are left out, as are words fewer than minHuman
// couplets of the right length hold and words ok refuses; the commonest
// come first.
func TestFreshWords(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sheets"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"a.tsv":        "# words: 平安 春风\nsource\tword\tupper\tlower\nx\t富贵\t富贵门庭春常在\t平安家宅福长临\n",
		"sheets/b.tsv": "id\t上联\n1\t万事如意\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	used, err := UsedWords(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"平安", "春风", "富贵", "万事如意"} {
		if !used[w] {
			t.Errorf("UsedWords misses %s", w)
		}
	}
	if used["富贵门庭春常在"] || used["门庭"] {
		t.Errorf("UsedWords counts a couplet line or its parts: %v", used)
	}
	pool := []Couplet{
		{Upper: "门庭春暖花常好", Lower: "岁月人和福自多"},
		{Upper: "门庭喜气迎春早", Lower: "平安岁月福长多"},
		{Upper: "岁月如歌春意闹", Lower: "门庭似锦福长高"},
		{Upper: "门庭春暖", Lower: "岁月人和"}, // another length
	}
	got := FreshWords(pool, 7, 3, 2, used, func(w string) bool { return w != "福长" })
	want := []WordCount{{"岁月", 3}, {"门庭", 3}}
	if len(got) < 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("FreshWords = %v, want %v first", got, want)
	}
	for _, wc := range got {
		if used[wc.Word] || wc.Human < 2 || wc.Word == "福长" {
			t.Errorf("FreshWords kept %v", wc)
		}
	}
	if got := FreshWords(pool, 7, 1, 2, used, nil); len(got) != 1 {
		t.Errorf("n = 1: %v", got)
	}
}
