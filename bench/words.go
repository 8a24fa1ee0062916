package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"unicode/utf8"
)

// BlessingWords is the built-in list of two-character blessing words that
// keyword and acrostic requests draw from. Invariant (tested): every entry is
// exactly two Han characters and the list has no duplicates.
var BlessingWords = []string{
	"平安", "富贵", "吉祥", "如意", "福寿", "安康", "幸福", "团圆", "和睦", "兴旺",
	"发达", "顺利", "美满", "快乐", "长寿", "丰收", "发财", "鸿运", "好运", "吉庆",
	"喜庆", "新春", "迎春", "春风", "瑞雪", "万福", "纳福", "五福", "百福", "祥瑞",
	"福禄", "招财", "进宝", "聚财", "生财", "兴隆", "昌盛", "繁荣", "和谐", "康宁",
	"安宁", "太平", "丰年", "丰登", "富裕", "成功", "腾飞", "鹏程", "锦绣", "辉煌",
	"同心", "和美", "家和", "添丁", "长青", "勤俭", "书香", "春晖", "喜乐", "欢乐",
	"金玉", "满堂", "祝福", "健康",
}

// UpperLines is the built-in list of 上联 for the "lower" mode (the service
// writes the matching 下联 and a 横批). Traditional, widely posted lines of
// five or seven characters.
var UpperLines = []string{
	"春回大地千山秀",
	"天增岁月人增寿",
	"一帆风顺年年好",
	"爆竹声中辞旧岁",
	"欢天喜地度佳节",
	"春满人间百花吐",
	"五湖四海皆春色",
	"门迎百福福星照",
	"和顺一门有百福",
	"春临大地百花艳",
	"红梅含苞傲冬雪",
	"冬去山川齐秀丽",
	"福旺财旺运气旺",
	"春风得意财源广",
	"瑞雪兆丰年",
	"家和万事兴",
	"春暖花开日",
	"新春添喜气",
}

// Modes the generator knows; they mirror couplet.Mode without importing it so
// the package stays usable against any endpoint.
var knownModes = map[string]bool{"keyword": true, "acrostic": true, "lower": true}

// ParseModes splits "keyword,acrostic" and checks every mode.
func ParseModes(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		if m == "" {
			continue
		}
		if !knownModes[m] {
			return nil, fmt.Errorf("unknown mode %q (want keyword, acrostic or lower)", m)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no mode given")
	}
	return out, nil
}

// Prompt is one request's input.
type Prompt struct {
	Mode string // keyword, acrostic or lower
	Text string // the blessing word or the 上联
	Seed uint64 // sampling seed sent to the server
}

// promptSource deals prompts from a seeded generator. The sequence of prompts
// is fixed by the seed; which worker gets which prompt depends on scheduling.
// Safe for concurrent use (mu guards rng).
type promptSource struct {
	mu    sync.Mutex
	rng   *rand.Rand
	modes []string
}

func newPromptSource(seed uint64, modes []string) *promptSource {
	if len(modes) == 0 {
		modes = []string{"keyword"}
	}
	return &promptSource{rng: rand.New(rand.NewPCG(seed, 0x6368756e6c69616e)), modes: modes}
}

func (s *promptSource) next() Prompt {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.modes[s.rng.IntN(len(s.modes))]
	p := Prompt{Mode: m, Seed: s.rng.Uint64() >> 1} // >>1: fits int64 servers
	if m == "lower" {
		p.Text = UpperLines[s.rng.IntN(len(UpperLines))]
	} else {
		p.Text = BlessingWords[s.rng.IntN(len(BlessingWords))]
	}
	return p
}

// countHan counts the Han characters of s: the output-token estimate for a
// character-level model when the server reports no usage (punctuation,
// labels like 上联： and newlines are not generated tokens of the lines).
func countHan(s string) int {
	n := 0
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		s = s[size:]
		if isHan(r) {
			n++
		}
	}
	return n
}

func isHan(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2EBEF) || (r >= 0xF900 && r <= 0xFAFF)
}
