package critic

import (
	"bufio"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode"
)

func TestParallelismClearCases(t *testing.T) {
	good := Parallelism("天高云淡", "地阔山青")
	bad := Parallelism("天高云淡", "我们的了")
	if good < 0.75 {
		t.Errorf("天高云淡/地阔山青 = %.3f, want ≥ 0.75", good)
	}
	if bad > 0.4 {
		t.Errorf("天高云淡/我们的了 = %.3f, want ≤ 0.4", bad)
	}
	if p := Parallelism("门纳平安开泰运", "户迎富贵纳祯祥"); p <= Parallelism("门纳平安开泰运", "的了吗呢我你他") {
		t.Errorf("a real pair (%.3f) does not beat function words", p)
	}
	if p := Parallelism("天高云淡", "地阔山"); p != 0 {
		t.Errorf("lines of different length = %v, want 0", p)
	}
	if p := Parallelism("", ""); p != 0 {
		t.Errorf("empty lines = %v, want 0", p)
	}
	if p := Parallelism("，", "，"); p != 1 {
		t.Errorf("the same mark facing itself = %v, want 1", p)
	}
	if p := Parallelism("，", "福"); p != 0 {
		t.Errorf("a mark facing a character = %v, want 0", p)
	}
	if p, q := Parallelism("春风，春雨", "福气，福星"), Parallelism("春风，春雨", "福，气福星"); p <= q || p > 1 || q < 0 {
		t.Errorf("marks aligned %v, misaligned %v: want aligned higher, both in [0,1]", p, q)
	}
}

func TestSegmentCoversLine(t *testing.T) {
	for _, line := range []string{"新春柳绿千山绿", "香自大同谁富贵，山因直至士从容", "福"} {
		var b strings.Builder
		for _, w := range Segment(line) {
			if n := len([]rune(w.Text)); n < 1 || n > 2 {
				t.Errorf("%s: word %q of %d characters", line, w.Text, n)
			}
			b.WriteString(w.Text)
		}
		if b.String() != line {
			t.Errorf("segments of %q join to %q", line, b.String())
		}
	}
	// 天 is a noun in couplets (jieba's dictionary tags it a measure word).
	if ws := Segment("天"); len(ws) != 1 || ws[0].Class != ClassNoun {
		t.Errorf("Segment(天) = %v, want one noun", ws)
	}
}

// OpensWord: the acrostic heads readers accepted open a word; those they
// marked odd for a made-up opening (业羊, 丽回, 润中) do not.
func TestOpensWord(t *testing.T) {
	for line, want := range map[string]bool{
		"春风送暖千家乐": true, "日子红火腾腾起": true, "马蹄踏雪贺新春": true,
		"业羊起舞迎新春": false, "丽回大地绿如茵": false, "润中翠竹万竿青": false,
		"福": false, "": false,
	} {
		if got := OpensWord(line); got != want {
			t.Errorf("OpensWord(%q) = %v, want %v", line, got, want)
		}
	}
}

// readTSV returns the first two fields of each line, or skips the test
// when the shared corpora are absent.
func readTSV(t testing.TB, path string) [][2]string {
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("corpus absent (%v): skipped", err)
	}
	defer f.Close()
	var out [][2]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) >= 2 {
			out = append(out, [2]string{fs[0], fs[1]})
		}
	}
	return out
}

// auc is the probability that a positive outscores a negative.
func auc(pos, neg []float64) float64 {
	neg = slices.Clone(neg)
	sort.Float64s(neg)
	var w float64
	for _, p := range pos {
		lo := sort.SearchFloat64s(neg, p)
		hi := sort.Search(len(neg), func(i int) bool { return neg[i] > p })
		w += float64(lo) + float64(hi-lo)/2
	}
	return w / float64(len(pos)) / float64(len(neg))
}

// The held-out test pairs must be more parallel than the same 上联s with
// another pair's 下联 of the same length.
func TestParallelismSeparatesHeldOutPairs(t *testing.T) {
	pairs := readTSV(t, "../../shared/data/couplets/test.tsv")
	byLen := map[int][]int{}
	for i, p := range pairs {
		n := len([]rune(p[0]))
		byLen[n] = append(byLen[n], i)
	}
	var pos, neg []float64
	for _, idx := range byLen {
		for k, i := range idx {
			j := idx[(k+1)%len(idx)]
			if i != j {
				pos = append(pos, Parallelism(pairs[i][0], pairs[i][1]))
				neg = append(neg, Parallelism(pairs[i][0], pairs[j][1]))
			}
		}
	}
	a := auc(pos, neg)
	t.Logf("true vs mismatched 下联: AUC %.4f over %d pairs", a, len(pos))
	if a < 0.75 {
		t.Errorf("AUC %.4f < 0.75", a)
	}
}

func TestUnsuitable(t *testing.T) {
	cases := []struct {
		text string
		want []string
	}{
		{"天增岁月人增寿\t春满乾坤福满楼", nil},
		{"无忧无虑度新春\t不愁吃穿过好年", nil},
		{"离别愁绪泪满襟", []string{"泪", "愁", "离别"}},
		{"离不开家乡的热土", nil},
		{"独领风骚", nil},
		{"满腹牢骚", []string{"骚"}},
		{"无忧无愁还忧", []string{"忧"}}, // the second 忧 is not inside 无忧
		{"春风一度", []string{"春风一度"}},
		{"百病不侵身体健", nil},
		{"久病缠身", []string{"病"}},
		// Marked odd by both readers of cpu-bf16x3-ab.tsv.
		{"欢乐年年迎富贵\t平安夜夜度新春", []string{"平安夜"}}, // read as Christmas Eve
		{"春晖一抹红梅笑\t秋色满园紫燕飞", []string{"秋"}},
		{"迎春接福年年好\t反腐倡廉步步高", []string{"反腐", "倡廉"}},
		{"春华秋实", nil},
		// Marked odd by both readers of cpu-temperature-ab.tsv.
		{"万里长征永安乐\t八年抗战长精神", []string{"抗战"}},
		{"得意人生真顺遂\t无情岁月太匆忙", []string{"无情"}},
		{"一代名师称心术", []string{"心术"}},
		// Marked odd by both readers of cpu-bf16x3-ab.tsv's second section.
		{"春在元宵花簇锦\t岁逢端午梦生香", []string{"端午"}},
		{"千年古寺钟声远\t四面青山暮色深", []string{"古寺", "暮色"}},
		{"百年老树一枝秀\t十载寒窗两鬓霜", []string{"两鬓", "鬓霜", "寒"}},
		{"四时花好皆春色\t一夜雪寒尽白头", []string{"白头"}},
		{"一树桃花开笑脸\t几枝柳叶展颦眉", []string{"颦"}},
		{"千年一脉终成梦\t两岸双亲已变心", []string{"变心"}},
		// Marked odd by both readers of style-ab3.tsv and cpu-bf16x3-ab.tsv.
		{"窗花自在心中瘦\t月色清于指上凉", []string{"瘦", "凉"}},
		{"人生苦短幸福路\t世事艰辛勤奋行", []string{"苦短"}},
		{"心归宁静纳清凉", nil},
		// Autumn: 77 of 96 marks odd in the recorded readings; 千秋, 春秋,
		// 秋实, 秋收 and 秋千 are not autumn scenery.
		{"丹桂飘香秋月冷\t碧山凝黛夕阳红", []string{"秋", "冷"}},
		{"团年老树红枫艳\t遍地鲜花瑞雪香", []string{"枫"}},
		{"千秋伟业春秋笔\t秋实秋收荡秋千", nil},
		// The autumn wind: 67 of 82 marks odd.
		{"银月高悬千里照\t金风送爽万家春", []string{"金风", "送爽"}},
		// Nostalgia and solitude: 75-100 % of marks odd.
		{"万亩桃源迎贵客\t一江春水向东流", []string{"东流"}},
		{"来客登楼寻旧梦\t举杯邀月醉新欢", []string{"旧梦", "邀月"}},
		{"风拂柳丝轻似燕\t雨敲荷叶碎如珠", []string{"荷"}},
		{"压岁钱装红荷包", nil},
		{"游春乐事千般好\t赏月佳人万事欢", []string{"佳人"}},
		// Off-season and prosaic: read odd in 81-100 % of marks in the
		// recorded readings; the farming seasons, 寒梅 and 难忘 are not.
		{"春来陌上月明色\t夏至池中蛙鼓声", []string{"夏"}},
		{"春耕夏种千畴绿\t秋收冬藏万亩金", nil},
		{"华夏腾飞\t寒梅傲雪迎春到", nil},
		{"窗花有意春风绿\t墨色无声夜雨寒", []string{"寒"}},
		{"富贵何妨宜淡了\t聪明难得且闲之", []string{"何", "难", "且"}},
		{"今宵月色同谁醉\t此刻花香共我痴", []string{"谁", "我"}},
		{"难忘今宵", nil},
		// Modal and argumentative words, courtship and the crane: read odd
		// in 82-100 % of marks; 不休, 必胜, 非凡, 可喜, 能工 and 功夫 are not.
		{"胜利年华休问价\t太平世界莫贪杯", []string{"休", "问"}},
		{"有余有为当益寿\t无忧无虑可延年", []string{"可"}},
		{"联中妙句良缘好\t松鹤同修千古道", []string{"缘", "鹤"}},
		{"笑语欢歌乐不休\t能工巧匠展非凡", nil},
		{"可喜可贺迎新岁\t必胜功夫在勤劳", nil},
		// No way in (致富无门, 报国无门): every use in the human spring
		// couplets is a complaint; both readers marked 致富无门 odd.
		{"发财有道千般好\t致富无门万事和", []string{"无门"}},
		// 花街柳巷, 寻花问柳: innuendo.
		{"花开柳巷月满满\t雪映梅亭香飘飘", []string{"柳巷"}},
	}
	for _, c := range cases {
		if got := Unsuitable(c.text); !slices.Equal(got, c.want) {
			t.Errorf("Unsuitable(%q) = %q, want %q", c.text, got, c.want)
		}
	}
	for b, want := range map[string]bool{"春风一度": true, "富贵在天": true, "如花似玉": true, "一路平安": true, "万象更新": false, "五福临门": false, "泪洒长天": true} {
		if got := UnsuitableBanner(b); got != want {
			t.Errorf("UnsuitableBanner(%s) = %v, want %v", b, got, want)
		}
	}
}

// Taboo keeps the ill-omened categories only, with their exceptions, and
// every category it names is a section of unsuitable.txt holding words.
func TestTaboo(t *testing.T) {
	for text, want := range map[string][]string{
		"死亡":   {"死", "亡"},
		"病痛":   {"病", "病痛"},
		"离婚":   {"离婚"},
		"春风一度": {"春风一度"},
		"破产":   {"破产"},
		"兴亡":   nil, // an exception masks 亡
		"无病":   nil,
		"秋高气爽": nil, // autumn is out of season, not ill-omened
		"佛光":   nil, // another occasion's couplet
		"平安":   nil,
	} {
		if got := Taboo(text); !slices.Equal(got, want) {
			t.Errorf("Taboo(%s) = %q, want %q", text, got, want)
		}
	}
	if len(Unsuitable("秋高气爽")) == 0 {
		t.Errorf("Unsuitable(秋高气爽) is empty: the case above no longer tells Taboo from Unsuitable")
	}
	found := map[string]int{}
	for _, c := range categories(unsuitableTxt) {
		found[c.name] += len(c.entries)
	}
	for _, name := range tabooCategories {
		if found[name] == 0 {
			t.Errorf("taboo category %q has no entries in unsuitable.txt", name)
		}
	}
	// Every entry lies in a named section.
	if n := found[""]; n > 0 {
		t.Errorf("%d entries of unsuitable.txt precede any section name", n)
	}
}

// Every entry is Chinese characters, none repeats, and every exception
// contains a word it masks.
func TestListsWellFormed(t *testing.T) {
	for name, txt := range map[string]string{"unsuitable.txt": unsuitableTxt, "banners_unsuitable.txt": bannersUnsuitableTxt} {
		seen := map[string]bool{}
		for _, e := range entries(txt) {
			w := strings.TrimPrefix(e, "!")
			for _, r := range w {
				if !unicode.Is(unicode.Han, r) {
					t.Errorf("%s: entry %q has a non-Chinese character", name, e)
				}
			}
			if seen[e] {
				t.Errorf("%s: %q repeats", name, e)
			}
			seen[e] = true
		}
	}
	ls := loadLists()
	for _, e := range ls.exceptions {
		if !slices.ContainsFunc(ls.words, func(w string) bool { return strings.Contains(e, w) }) {
			t.Errorf("exception %q masks no word of the list", e)
		}
	}
}

func TestFestive(t *testing.T) {
	if f := Festive(""); f != 0 {
		t.Errorf("Festive(\"\") = %v", f)
	}
	spring := Festive("新春柳绿千山绿\t盛世花红万户红")
	plain := Festive("晚风摇树树还挺\t晨露润花花更红")
	if spring <= plain {
		t.Errorf("spring couplet %.3f ≤ general couplet %.3f", spring, plain)
	}
}

// The real 春联 (with 横批) must read as more festive than the held-out
// general pairs; gen's -eval reports the same figure with them left out
// of the table.
func TestFestiveSeparatesRealSpringCouplets(t *testing.T) {
	real := readTSV(t, "../../shared/data/spring/with_banner.tsv")
	test := readTSV(t, "../../shared/data/couplets/test.tsv")
	score := func(ps [][2]string) []float64 {
		out := make([]float64, len(ps))
		for i, p := range ps {
			out[i] = Festive(p[0] + "\t" + p[1])
		}
		return out
	}
	a := auc(score(real), score(test))
	t.Logf("real 春联 vs test.tsv: AUC %.4f", a)
	if a < 0.7 {
		t.Errorf("AUC %.4f < 0.7", a)
	}
}

func BenchmarkParallelism(b *testing.B) {
	Load()
	pairs := [][2]string{{"新春柳绿千山绿", "盛世花红万户红"}, {"门纳平安开泰运", "户迎富贵纳祯祥"}, {"香自大同谁富贵", "山因直至士从容"}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := pairs[i%len(pairs)]
		Parallelism(p[0], p[1])
	}
}

func BenchmarkLoad(b *testing.B) {
	for i := 0; i < b.N; i++ {
		loadSegmenter()
	}
}

func BenchmarkFestive(b *testing.B) {
	loadFestive()
	for i := 0; i < b.N; i++ {
		Festive("新春柳绿千山绿\t盛世花红万户红")
	}
}

func BenchmarkUnsuitable(b *testing.B) {
	loadLists()
	for i := 0; i < b.N; i++ {
		Unsuitable("新春柳绿千山绿\t盛世花红万户红\t万象更新")
	}
}

// The reranker scores candidates from many request goroutines at once.
func TestConcurrentUse(t *testing.T) {
	want := Parallelism("新春柳绿千山绿", "盛世花红万户红")
	done := make(chan float64)
	for g := 0; g < 8; g++ {
		go func() {
			var p float64
			for i := 0; i < 200; i++ {
				p = Parallelism("新春柳绿千山绿", "盛世花红万户红")
				Unsuitable("离别愁绪泪满襟")
				Festive("新春柳绿千山绿")
			}
			done <- p
		}()
	}
	for g := 0; g < 8; g++ {
		if p := <-done; p != want {
			t.Errorf("concurrent Parallelism = %v, want %v", p, want)
		}
	}
}

func TestAssess(t *testing.T) {
	a := Assess("一岸春风花溅泪", "三江月色水凝愁", "春风一度")
	if !slices.Equal(a.Unsuitable, []string{"泪", "愁", "春风一度"}) || !a.BannerUnsuitable {
		t.Errorf("Assess = %+v, want 泪 愁 春风一度 and an unsuitable 横批", a)
	}
	if a.Parallelism != Parallelism("一岸春风花溅泪", "三江月色水凝愁") || a.Festive != Festive("一岸春风花溅泪\t三江月色水凝愁") {
		t.Errorf("Assess = %+v disagrees with the single scores", a)
	}
	if b := Assess("天增岁月人增寿", "春满乾坤福满楼", ""); b.BannerUnsuitable || len(b.Unsuitable) > 0 {
		t.Errorf("Assess of a clean couplet without 横批 = %+v", b)
	}
}

// TestWrongYear: for the Spring Festival of 2027 (羊 arrives, 马 leaves)
// only the right animals may be welcomed or bid farewell; animals used as
// images belong to no year.
func TestWrongYear(t *testing.T) {
	if a, l := YearAnimals(2027); a != '羊' || l != '马' {
		t.Fatalf("YearAnimals(2027) = %c, %c; want 羊, 马", a, l)
	}
	if a, l := YearAnimals(2020); a != '鼠' || l != '猪' {
		t.Fatalf("YearAnimals(2020) = %c, %c; want 鼠, 猪", a, l)
	}
	for _, c := range []struct {
		text string
		want int
	}{
		{"玉兔迎春增福气", 1}, {"金龙辞岁发祥光", 1}, {"灵羊辞岁祥吉庆", 1}, {"骏马迎春福寿康", 1},
		{"蛇年大吉", 1}, {"金犬迎春", 1}, {"猴岁再描盛世图", 1}, {"马岁吉祥同祝寿", 0},
		{"骏马辞岁", 0}, {"金羊迎春到", 0}, {"羊年大吉", 0}, {"马到成功", 0}, {"龙凤呈祥", 0},
		{"鸡鸣犬吠", 0}, {"龙辞旧岁蛇贺新春", 2},
		// The readings' odd couplets of 2026-12-05: 金鸡 and 金猴 read as
		// their own years; 金 before the years of the festival is fine.
		{"金鸡报晓纳祥瑞", 1}, {"瑞雪迎福春来早", 0}, {"金猴恭喜迎春到", 1}, {"金马奔腾辞旧岁", 0},
		{"金羊献瑞", 0}, {"雄鸡报晓", 1},
	} {
		if got := WrongYear(c.text, 2027); len(got) != c.want {
			t.Errorf("WrongYear(%q, 2027) = %q, want %d claims", c.text, got, c.want)
		}
	}
	if got := (Judge{}).Unsuitable("玉兔迎春增福气"); len(got) != 0 {
		t.Errorf("Judge without a year flags %q", got)
	}
	if got := (Judge{Year: 2027}).Unsuitable("玉兔迎春增福气"); len(got) != 1 {
		t.Errorf("Judge{Year: 2027}.Unsuitable = %q, want the 兔迎 claim", got)
	}
}

func TestFestivalYear(t *testing.T) {
	for _, c := range []struct {
		date string
		want int
	}{{"2026-12-04", 2027}, {"2027-01-15", 2027}, {"2027-02-20", 2027}, {"2027-03-01", 2028}} {
		d, _ := time.Parse(time.DateOnly, c.date)
		if got := FestivalYear(d); got != c.want {
			t.Errorf("FestivalYear(%s) = %d, want %d", c.date, got, c.want)
		}
	}
}

// unsuitableRef is Unsuitable as one strings.Index scan per entry: the
// definition the one-pass scan must match.
func unsuitableRef(text string) []string {
	ls := loadLists()
	var masked []bool
	for _, e := range ls.exceptions {
		for i := 0; ; {
			j := strings.Index(text[i:], e)
			if j < 0 {
				break
			}
			if masked == nil {
				masked = make([]bool, len(text))
			}
			for k := i + j; k < i+j+len(e); k++ {
				masked[k] = true
			}
			i += j + len(e)
		}
	}
	var out []string
	for _, w := range ls.words {
		for i := 0; ; {
			j := strings.Index(text[i:], w)
			if j < 0 {
				break
			}
			if !allMasked(masked, i+j, i+j+len(w)) {
				out = append(out, w)
				break
			}
			i += j + len(w)
		}
	}
	return out
}

// Texts made of list entries, exceptions and their pieces, repeated and
// overlapped, give what one scan per entry gives.
func TestUnsuitableMatchesReference(t *testing.T) {
	ls := loadLists()
	pieces := append(append([]string{"春", "福", "，", "\t", "喜气"}, ls.words...), ls.exceptions...)
	r := rand.New(rand.NewPCG(7, 7))
	hits := 0
	for n := 0; n < 20000; n++ {
		var b strings.Builder
		for k := 1 + r.IntN(6); k > 0; k-- {
			p := []rune(pieces[r.IntN(len(pieces))])
			if r.IntN(3) == 0 && len(p) > 1 { // a piece of an entry
				p = p[r.IntN(len(p)):]
			}
			b.WriteString(string(p))
		}
		text := b.String()
		got, want := Unsuitable(text), unsuitableRef(text)
		if !slices.Equal(got, want) {
			t.Fatalf("Unsuitable(%q) = %q, want %q", text, got, want)
		}
		if len(want) > 0 {
			hits++
		}
	}
	if hits < 1000 {
		t.Fatalf("only %d of 20000 texts had an unsuitable word: the test does not exercise the scan", hits)
	}
}

// What the reranker asks of each candidate line with the year check on.
func BenchmarkJudgeUnsuitable(b *testing.B) {
	loadLists()
	j := Judge{Year: 2027}
	lines := []string{"新春柳绿千山绿", "盛世花红万户红", "金蛇辞岁千家乐", "骏马迎春万户欢", "门纳平安开泰运", "户迎富贵纳祯祥"}
	for i := 0; b.Loop(); i++ {
		j.Unsuitable(lines[i%len(lines)])
	}
}

// TestEveryWordFound: each word of unsuitable.txt, standing alone, is
// reported (so the first-rune index, bitmap included, knows every word).
func TestEveryWordFound(t *testing.T) {
	ls := loadLists()
	if len(ls.words) < 100 {
		t.Fatalf("%d words loaded", len(ls.words))
	}
	for _, w := range ls.words {
		if !slices.Contains(Unsuitable(w), w) {
			t.Errorf("Unsuitable(%q) = %q, want it listed", w, Unsuitable(w))
		}
	}
}

func TestIsYearAnimal(t *testing.T) {
	for _, c := range zodiac {
		if !IsYearAnimal(c) {
			t.Errorf("IsYearAnimal(%q) = false", c)
		}
	}
	for _, c := range []rune{'犬', '春', 0, 'a'} {
		if IsYearAnimal(c) {
			t.Errorf("IsYearAnimal(%q) = true", c)
		}
	}
}

// TestHanSegmentMatchesGse: lines of ideographs only are segmented off
// gse's own path (hanDict), which must give gse's words and classes
// exactly: on random lines built from the dictionary's words and from
// characters it does not know (ties, overlaps, lines past 32 characters),
// and on the corpus when it is present.
func TestHanSegmentMatchesGse(t *testing.T) {
	Load()
	var singles, pairs []string
	for _, l := range strings.Split(wordsTxt, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0][0] == '#' {
			continue
		}
		if len([]rune(f[0])) == 1 {
			singles = append(singles, f[0])
		} else {
			pairs = append(pairs, f[0])
		}
	}
	if len(singles) < 1000 || len(pairs) < 10000 {
		t.Fatalf("%d single and %d two-character words", len(singles), len(pairs))
	}
	rng := rand.New(rand.NewPCG(7, 11))
	check := func(line string) {
		t.Helper()
		got, want := SegmentDict(line), gseSegment(line)
		if !slices.Equal(got, want) {
			t.Fatalf("SegmentDict(%q) = %v, gse %v", line, got, want)
		}
		got, want = Segment(line), withClassAlone(gseSegment(line))
		if !slices.Equal(got, want) {
			t.Fatalf("Segment(%q) = %v, gse and charclass.txt %v", line, got, want)
		}
	}
	for range 30000 {
		var b strings.Builder
		for n := 1 + rng.IntN(20); n > 0; n-- {
			switch k := rng.IntN(10); {
			case k < 5:
				b.WriteString(pairs[rng.IntN(len(pairs))])
			case k < 9:
				b.WriteString(singles[rng.IntN(len(singles))])
			case k == 9 && rng.IntN(2) == 0:
				b.WriteRune(rune(0x3400 + rng.IntN(0x4dbf-0x3400+1)))
			default:
				b.WriteRune(rune(0x4e00 + rng.IntN(0x9fff-0x4e00+1)))
			}
		}
		check(b.String())
	}
	for _, p := range readTSV(t, "../../shared/data/couplets/test.tsv") {
		for _, line := range p {
			if line != "" && !strings.ContainsFunc(line, func(r rune) bool { return !isIdeograph(r) }) {
				check(line)
			}
		}
	}
}

// TestFestiveMatchesTable: Festive is the plain mean over festive.txt's
// units (looked up in its maps, 0 when absent), on random text mixing
// the table's characters, others and separators.
func TestFestiveMatchesTable(t *testing.T) {
	tb := loadFestive()
	var pool []rune
	for r := range tb.chars {
		pool = append(pool, r)
	}
	for k := range tb.bigrams {
		pool = append(pool, k[0], k[1])
	}
	slices.Sort(pool)
	pool = append(pool, '人', '\t', '，', 'a', 0x20000)
	rng := rand.New(rand.NewPCG(3, 5))
	for range 5000 {
		r := make([]rune, 1+rng.IntN(16))
		for i := range r {
			r[i] = pool[rng.IntN(len(pool))]
		}
		var s float64
		n := 0
		for i, c := range r {
			if !isHan(c) {
				continue
			}
			s += tb.chars[c]
			n++
			if i+1 < len(r) && isHan(r[i+1]) {
				s += tb.bigrams[[2]rune{c, r[i+1]}]
				n++
			}
		}
		want := 0.0
		if n > 0 {
			want = s / float64(n)
		}
		if got := Festive(string(r)); got != want {
			t.Fatalf("Festive(%q) = %v, want %v", string(r), got, want)
		}
	}
}

func TestIsPunct(t *testing.T) {
	for r := rune(0); r < 0x10000; r++ {
		if isPunct(r) != unicode.IsPunct(r) {
			t.Fatalf("isPunct(%U) = %v, unicode.IsPunct %v", r, isPunct(r), unicode.IsPunct(r))
		}
	}
}
