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
//	藏头 (acrostic): 藏头 and a two-character word: "写一副藏头联，藏“平安”"
//	下联 (lower):    a 上联 after 上联：/上联是: "上联：春回大地千山秀，请对下联"
//	keyword:        a quoted two-character word or one after 关于/以/主题/带/含:
//	                "请给我写一副关于平安的春联", "以吉祥为主题写春联"
//
// and, with no instruction words at all, the bare text as before (two
// characters: keyword; longer: a 上联). A sentence that asks for a couplet
// but names nothing usable is a 400 saying what is accepted, never the
// whole sentence used as a 上联.

var (
	// a word in quotes or brackets
	reQuoted = regexp.MustCompile(`[“"'‘「『《【（(]\s*(\p{Han}{2})\s*[”"'’」』》】）)]`)
	// a keyword after a topic marker
	reTopic = regexp.MustCompile(`(?:关于|有关|以|主题(?:是|为)?|带有?|含有?|包含|嵌入?|围绕)[：:]?\s*(\p{Han}{2})(?:的|为|主题|二字|两字|这|$|[，。,！!？?])`)
	// 藏头: the two heads after 藏 / 藏头
	reHeads = regexp.MustCompile(`藏(?:头)?(?:是|为)?[：:]?\s*(\p{Han}{2})(?:二字|两字|的|$|[，。,！!？?])`)
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
	if m := reTopic.FindStringSubmatch(text); m != nil && m[1] != "春联" && m[1] != "对联" {
		return couplet.ModeKeyword, m[1], nil
	}
	if m := reAfterColon.FindStringSubmatch(text); m != nil {
		return couplet.ModeKeyword, m[1], nil
	}
	return "", "", intentError()
}

func intentError() *apiError {
	e := errf(http.StatusBadRequest, codeInvalidPrompt,
		"没有读懂要写什么春联。可以这样写：“平安”（吉祥词）、“请写一副关于平安的春联”、“写一副藏头联，藏‘平安’”、“上联：春回大地千山秀，请对下联”，或用 mode 字段（keyword、acrostic、lower）",
		"could not tell what couplet to write. Send a two-character blessing word (平安), a sentence naming one (请写一副关于平安的春联), an acrostic request (写一副藏头联，藏“平安”), a 上联 to answer (上联：春回大地千山秀，请对下联), or set the \"mode\" field (keyword, acrostic, lower)")
	e.Param = strPtr("messages")
	return e
}

func strPtr(s string) *string { return &s }
