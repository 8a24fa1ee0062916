package server

import (
	"net/http"
	"regexp"
	"strings"
	"unicode/utf8"

	"chunlian/couplet"
)

// Natural-language requests on /v1/chat/completions. Chat clients write
// sentences ("请给我写一副关于平安的春联"), not a bare blessing word, so the
// last user message is read for one of:
//
//	藏头 (acrostic): 藏头 and a two-character word: "写一副藏头联，藏“平安”",
//	                "用平安藏头写一副对联"
//	下联 (lower):    a 上联 after 上联：/上联是: "上联：春回大地千山秀，请对下联"
//	keyword:        a quoted blessing word (one, two or four characters), one
//	                after 关于/以/主题/带/含, or one that names the couplet:
//	                "请给我写一副关于平安的春联", "以吉祥为主题写春联",
//	                "给我写一副心想事成的春联", "来一副吉祥春联"
//
// and, with no instruction words at all, the bare text as before (two
// characters: keyword; longer: a 上联). A sentence that asks for a couplet
// but names nothing usable is a 400 saying what is accepted, never the
// whole sentence used as a 上联.

var (
	// a word in quotes or brackets
	reQuoted = regexp.MustCompile(`[“"'‘「『《【（(]\s*(\p{Han}{1,4})\s*[”"'’」』》】）)]`)
	// a keyword after a topic marker
	reTopic = regexp.MustCompile(`(?:关于|有关|以|主题(?:是|为)?|带有?|含有?|包含|嵌入?|围绕)[：:]?\s*(\p{Han}{1,4}?)(?:的|为|主题|[一二两四]字|这|$|[，。,！!？?])`)
	// a keyword naming the couplet: 一副X的春联, 来副X对联, X春联 (the whole text)
	reNamed = regexp.MustCompile(`(?:^|[一两几]副|[写来求要]副)\s*(\p{Han}{1,4}?)的?(?:春联|对联)`)
	// 藏头: the two heads after 藏 / 藏头
	reHeads = regexp.MustCompile(`藏(?:头)?(?:是|为)?[：:]?\s*(\p{Han}{2})(?:二字|两字|的|$|[，。,！!？?])`)
	// 藏头: the two heads before it: 用平安藏头, 平安藏头
	reHeadsBefore = regexp.MustCompile(`(?:^|用|以|拿|把)(\p{Han}{2})(?:二字|两字)?(?:来|做|作)?藏头`)
	// a 上联 after 上联：/上联是/上联为
	reUpper = regexp.MustCompile(`上联(?:是|为)?[：:]\s*([\p{Han}，、；：！？·]+?)(?:[，。,]?\s*(?:请|求|帮|对|给|写|下联)|[。.!！?？]|$)|上联(?:是|为)\s*([\p{Han}，、；：！？·]+?)(?:[，。,]?\s*(?:请|求|帮|对|给|写|下联)|[。.!！?？]|$)`)
	// a two-character word after a colon at the end: "藏头春联：吉祥"
	reAfterColon = regexp.MustCompile(`[：:]\s*(\p{Han}{2})$`)
	// words that make a message an instruction rather than a bare word/上联
	reInstruction = regexp.MustCompile(`春联|对联|下联|上联|藏头|横批|写|帮|请|给我|来一副|一副`)
)

// chatIntent reads the mode and prompt from a chat message (already
// normalised with couplet.Normalize). mode is the request's explicit
// "mode" extension field, which wins over the wording.
func chatIntent(text, mode string) (couplet.Mode, string, *apiError) {
	if mode != "" {
		return couplet.Mode(mode), text, nil
	}
	if !reInstruction.MatchString(text) {
		return autoMode("", text), text, nil
	}
	if strings.Contains(text, "藏头") || strings.Contains(text, "藏字") {
		if m := reQuoted.FindStringSubmatch(text); m != nil {
			return couplet.ModeAcrostic, m[1], nil
		}
		if m := reHeads.FindStringSubmatch(strings.ReplaceAll(text, "藏头联", "藏头")); m != nil && m[1] != "春联" && m[1] != "对联" {
			return couplet.ModeAcrostic, m[1], nil
		}
		if m := reAfterColon.FindStringSubmatch(text); m != nil {
			return couplet.ModeAcrostic, m[1], nil
		}
		if m := reHeadsBefore.FindStringSubmatch(text); m != nil {
			return couplet.ModeAcrostic, m[1], nil
		}
		return "", "", intentError()
	}
	if m := reUpper.FindStringSubmatch(text); m != nil {
		up := m[1]
		if up == "" {
			up = m[2]
		}
		up = strings.Trim(up, "，、；：！？·")
		if utf8.RuneCountInString(up) >= 2 {
			return couplet.ModeLower, up, nil
		}
	}
	if strings.Contains(text, "下联") || strings.Contains(text, "上联") {
		return "", "", intentError()
	}
	if m := reQuoted.FindStringSubmatch(text); m != nil {
		return couplet.ModeKeyword, m[1], nil
	}
	if m := reTopic.FindStringSubmatch(text); m != nil && blessingWord(m[1]) {
		return couplet.ModeKeyword, m[1], nil
	}
	if m := reNamed.FindStringSubmatch(text); m != nil && blessingWord(m[1]) {
		return couplet.ModeKeyword, m[1], nil
	}
	if m := reAfterColon.FindStringSubmatch(text); m != nil {
		return couplet.ModeKeyword, m[1], nil
	}
	return "", "", intentError()
}

// notTopics are words that can stand where a couplet's blessing word does
// (写一副好的春联, 来一副七字对联) but only describe it.
// Words ending in 字 (七字) and the instruction's own characters are
// refused by blessingWord itself.
var notTopics = map[string]bool{
	"春联": true, "对联": true, "好": true, "好看": true, "漂亮": true, "精彩": true, "优美": true,
	"经典": true, "传统": true, "普通": true, "简单": true, "新": true, "长": true, "短": true, "个": true,
}

// blessingWord reports whether w can be the keyword of a chat request:
// one, two or four characters (the lengths Generate takes) that are not
// a description of the couplet or part of the instruction (写一副…).
func blessingWord(w string) bool {
	n := utf8.RuneCountInString(w)
	return (n == 1 || n == 2 || n == 4) && !notTopics[w] && !strings.HasSuffix(w, "字") &&
		!strings.ContainsAny(w, "写副请帮给来要我")
}

func intentError() *apiError {
	e := errf(http.StatusBadRequest, codeInvalidPrompt,
		"没有读懂要写什么春联。可以这样写：“平安”（吉祥词）、“请写一副关于平安的春联”、“写一副藏头联，藏‘平安’”、“上联：春回大地千山秀，请对下联”，或用 mode 字段（keyword、acrostic、lower）",
		"could not tell what couplet to write. Send a two-character blessing word (平安), a sentence naming one (请写一副关于平安的春联), an acrostic request (写一副藏头联，藏“平安”), a 上联 to answer (上联：春回大地千山秀，请对下联), or set the \"mode\" field (keyword, acrostic, lower)")
	e.Param = strPtr("messages")
	return e
}

func strPtr(s string) *string { return &s }
