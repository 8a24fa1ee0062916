package couplet

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/longbridgeapp/opencc"
)

// asciiPunct maps ASCII punctuation users type to the full-width marks of
// the corpus.
var asciiPunct = map[rune]rune{',': '，', ';': '；', ':': '：', '!': '！', '?': '？'}

// Normalize cleans user text the way the training data was cleaned: all
// whitespace (incl. U+3000, BOM, zero-width spaces) removed, traditional
// characters converted to simplified (OpenCC t2s, phrase-aware: 福壽 → 福寿,
// 乾坤 stays), ASCII ,;:!? mapped to full-width, and trailing "。" / "."
// dropped. It does not validate. Every interface (HTTP /generate, the
// OpenAI endpoints, the CLI through Generate) normalises with it, so the
// same text means the same request everywhere.
func Normalize(s string) string {
	s = toSimplified(s)
	var b strings.Builder
	for _, r := range s {
		if unicode.IsSpace(r) || r == '\ufeff' || (r >= '\u200b' && r <= '\u200d') || r == '\u2060' {
			continue
		}
		if f, ok := asciiPunct[r]; ok {
			r = f
		}
		b.WriteRune(r)
	}
	return strings.TrimRight(b.String(), "。.")
}

// t2s is OpenCC's traditional → simplified converter (dictionaries embedded
// in the binary); nil if it could not be built, which only a broken build
// of the dependency can cause.
var t2s = sync.OnceValue(func() *opencc.OpenCC {
	c, err := opencc.New("t2s")
	if err != nil {
		return nil
	}
	return c
})

// toSimplified converts s to simplified characters; text without any
// non-ASCII character is returned as is.
func toSimplified(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			ascii = false
			break
		}
	}
	c := t2s()
	if ascii || c == nil {
		return s
	}
	out, err := c.Convert(s)
	if err != nil {
		return s
	}
	return out
}

// plan is a validated, normalised request.
type plan struct {
	mode     Mode
	heads    [2]int32 // keyword or acrostic characters (ids)
	headText string   // the normalised Text for keyword/acrostic
	upper    []int32  // lower mode: the given 上联's ids
	// template is the line form (see Layout): per position -1 for a
	// character slot, else the id of the punctuation mark that must be there.
	template []int32 // [lineLen] -1 = character slot, else the punct id
	lineLen  int     // tokens per line (characters + punctuation)
	n        int
	temp     float32
	topP     float32
	topK     int
	seed     uint64
	unconstr bool
	onToken  func(TokenEvent)
	// phrase: a four-character keyword that opens the 上联: heads are its
	// first two characters, tail its last two (preparePhrase).
	phrase bool
	tail   [2]int32
}

// prepare validates req against the vocabulary and fills in defaults
// (temp: the temperature of a request that leaves it unset). Every
// rejection is an *InputError.
func (t *tables) prepare(req Request, temp float32) (*plan, error) {
	p := &plan{mode: req.Mode, n: req.N, temp: req.Temperature, topP: req.TopP, topK: req.TopK,
		seed: req.Seed, unconstr: req.Unconstrained, onToken: req.OnToken}
	if p.mode == "" {
		p.mode = ModeKeyword
	}
	switch p.mode {
	case ModeKeyword, ModeAcrostic, ModeLower:
	default:
		return nil, inputErr(CodeBadMode, "未知模式 %q（可用 keyword、acrostic、lower）", "unknown mode %q (use keyword, acrostic or lower)", string(req.Mode))
	}
	if err := Limits.Validate(req); err != nil {
		return nil, err.(*InputError)
	}
	if p.n == 0 {
		p.n = 1
	}
	if p.temp == 0 { // unset; front ends map a user's 0 to greedy (SetTemperature)
		p.temp = temp
	}
	if p.temp < GreedyBelow {
		p.temp, p.topK = 1, 1
	}
	if p.topP == 0 {
		p.topP = DefaultTopP
	}
	if !utf8.ValidString(req.Text) {
		return nil, inputErr(CodeBadChar, "输入不是有效的 UTF-8 文本", "the text is not valid UTF-8")
	}
	text := []rune(Normalize(req.Text))
	if len(text) == 0 {
		return nil, inputErr(CodeEmpty, "请输入内容", "the text is empty")
	}
	if p.mode == ModeLower {
		return p, t.prepareLower(p, text)
	}
	// A blessing word no 春联 can be written with: the model would write
	// it into the 上联 as it writes any keyword. Before the checks below,
	// so that 死 is told why, not that no blessing word holds it.
	if t.judge != nil {
		if w := t.judge.Taboo(string(text)); len(w) > 0 {
			return nil, inputErr(CodeTabooWord, "“%s”含有不宜写进春联的字词（%s），请换一个吉祥词，例如：平安、富贵、万事如意",
				"%q holds a word that does not belong on a Spring Festival couplet (%s); try a blessing word such as 平安, 富贵 or 万事如意",
				string(text), strings.Join(w, "、"))
		}
	}
	for _, r := range text {
		if !IsHan(r) {
			return nil, inputErr(CodeBadKeyword, "请输入一个、两个或四个汉字（例如：福、平安、万事如意），收到 %q", "please enter one, two or four Chinese characters (e.g. 福, 平安, 万事如意), got %q", string(text))
		}
		if _, ok := t.charID(r); !ok {
			return nil, inputErr(CodeUnknownChar, "模型不认识“%c”字", "the model does not know the character %q", r)
		}
	}
	if len(text) == 1 && p.mode == ModeKeyword {
		// A one-character word is written with the two-character word of
		// the 横批 list that holds it (singleWords): 福 → 五福.
		w, ok := t.singles[text[0]]
		if !ok {
			return nil, inputErr(CodeBadKeyword, "“%c”字暂无可用的吉祥词，请输入两个汉字（例如：平安）", "no blessing word is known for %q; please enter two Chinese characters (e.g. 平安)", text[0])
		}
		text = []rune(w)
	}
	switch {
	case len(text) == 4 && p.mode == ModeKeyword:
		t.preparePhrase(p, text)
	case len(text) != 2:
		return nil, inputErr(CodeBadKeyword, "请输入两个汉字（例如：平安），收到 %q", "please enter exactly two Chinese characters (e.g. 平安), got %q", string(text))
	default:
		for i, r := range text {
			p.heads[i], _ = t.charID(r)
		}
	}
	if p.mode == ModeAcrostic && p.heads[0] == p.heads[1] {
		return nil, inputErr(CodeSameHeads, "藏头的两个字不能相同（上下联同位不能同字）", "the two acrostic heads must differ (the lines may not share a character at the same position)")
	}
	if p.headText == "" {
		p.headText = string(text)
	}
	length := req.Length
	if length == 0 {
		length = DefaultLength
	}
	if length < MinLength || length > t.maxChars {
		return nil, inputErr(CodeBadLength, "字数必须在 %d 到 %d 之间", "length must be between %d and %d characters", MinLength, t.maxChars)
	}
	comma, ok := t.charID('，')
	if !ok && length > 7 {
		return nil, inputErr(CodeBadLength, "模型不支持超过 7 字的对联", "the model cannot write lines longer than 7 characters")
	}
	for _, r := range Layout(length) {
		if r == 0 {
			p.template = append(p.template, -1)
		} else {
			p.template = append(p.template, comma)
		}
	}
	p.lineLen = len(p.template)
	if p.phrase && p.lineLen < 5 {
		return nil, inputErr(CodeBadLength, "四字吉祥词需要每联至少 5 个字", "a four-character phrase needs lines of at least 5 characters")
	}
	return p, nil
}

func (t *tables) prepareLower(p *plan, u []rune) error {
	if len(u) > t.sp.MaxLine {
		return inputErr(CodeBadLength, "上联最多 %d 个字符", "the 上联 may have at most %d characters", t.sp.MaxLine)
	}
	for i, r := range u {
		switch {
		case IsHan(r):
		case IsPunct(r):
			if i == 0 || i == len(u)-1 || IsPunct(u[i-1]) {
				return inputErr(CodeBadPunct, "标点不能在句首句尾或连续出现", "punctuation may not start or end the line or be doubled")
			}
		default:
			return inputErr(CodeBadChar, "上联只能包含汉字和标点（，、；：！？·），不能有“%c”", "the 上联 may contain only Chinese characters and ，、；：！？· (found %q)", r)
		}
		id, ok := t.charID(r)
		if !ok {
			return inputErr(CodeUnknownChar, "模型不认识“%c”字", "the model does not know the character %q", r)
		}
		p.upper = append(p.upper, id)
		if IsPunct(r) {
			p.template = append(p.template, id)
		} else {
			p.template = append(p.template, -1)
		}
	}
	if _, ok := t.sp.LengthToken(len(u)); !ok {
		return inputErr(CodeBadLength, "上联长度 %d 超出模型范围", "the model has no length token for %d characters", len(u))
	}
	p.lineLen = len(u)
	p.headText = string(u)
	return nil
}

// preparePhrase plans a four-character blessing phrase (万事如意) as a
// keyword that opens the 上联 whole (万事如意步步高 / …): the keyword
// prompt names its first half, and the constraint forces all four
// characters at the head of every sample. Blind readers preferred this to
// an embedded-word couplet (万事… / 如意…; docs/DECISIONS.md, "Four-
// character phrases").
func (t *tables) preparePhrase(p *plan, w []rune) {
	var ids [4]int32
	for i, r := range w {
		ids[i], _ = t.charID(r)
	}
	p.phrase = true
	p.heads = [2]int32{ids[0], ids[1]}
	p.tail = [2]int32{ids[2], ids[3]}
}
