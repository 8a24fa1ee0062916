package couplet

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// asciiPunct maps ASCII punctuation users type to the full-width marks of
// the corpus.
var asciiPunct = map[rune]rune{',': '，', ';': '；', ':': '：', '!': '！', '?': '？'}

// Normalize cleans user text the way the training data was cleaned: all
// whitespace (incl. U+3000, BOM, zero-width spaces) removed, ASCII ,;:!?
// mapped to full-width, and trailing "。" / "." dropped. It does not
// validate.
func Normalize(s string) string {
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
}

// prepare validates req against the vocabulary and fills in defaults.
// Every rejection is an *InputError.
func (t *tables) prepare(req Request) (*plan, error) {
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
		p.temp = DefaultTemperature
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
	if len(text) != 2 || !IsHan(text[0]) || !IsHan(text[1]) {
		return nil, inputErr(CodeBadKeyword, "请输入两个汉字（例如：平安），收到 %q", "please enter exactly two Chinese characters (e.g. 平安), got %q", string(text))
	}
	for i, r := range text {
		id, ok := t.charID(r)
		if !ok {
			return nil, inputErr(CodeUnknownChar, "模型不认识“%c”字", "the model does not know the character %q", r)
		}
		p.heads[i] = id
	}
	if p.mode == ModeAcrostic && text[0] == text[1] {
		return nil, inputErr(CodeSameHeads, "藏头的两个字不能相同（上下联同位不能同字）", "the two acrostic heads must differ (the lines may not share a character at the same position)")
	}
	p.headText = string(text)
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
