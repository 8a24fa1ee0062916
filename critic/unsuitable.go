package critic

import (
	_ "embed"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

var (
	//go:embed unsuitable.txt
	unsuitableTxt string
	//go:embed banners_unsuitable.txt
	bannersUnsuitableTxt string
)

// lists are the parsed unsuitable.txt (words and their exceptions) and
// banners_unsuitable.txt.
type lists struct {
	words      []string
	exceptions []string
	taboo      map[string]bool // words of the tabooCategories
	banners    map[string]bool
	// By first rune: indices into words and exceptions, so that a text is
	// scanned once instead of once per entry.
	wordsAt, exceptionsAt map[rune][]int32
	// starts has bit r set when a word or an exception begins with rune r
	// (r < 1<<16; other runes go to the maps): most characters of a text
	// begin no entry, and the bit spares them two map lookups.
	starts [1 << 16 / 64]uint64
}

// mayStart reports whether some word or exception may begin with r.
func (ls *lists) mayStart(r rune) bool { return bit(&ls.starts, r) }

var (
	listsOnce sync.Once
	theLists  lists
)

func loadLists() *lists {
	listsOnce.Do(func() {
		theLists.banners = map[string]bool{}
		theLists.taboo = map[string]bool{}
		for _, c := range categories(unsuitableTxt) {
			for _, l := range c.entries {
				if strings.HasPrefix(l, "!") {
					theLists.exceptions = append(theLists.exceptions, l[1:])
					continue
				}
				theLists.words = append(theLists.words, l)
				if slices.Contains(tabooCategories, c.name) {
					theLists.taboo[l] = true
				}
			}
		}
		for _, l := range entries(bannersUnsuitableTxt) {
			theLists.banners[l] = true
		}
		theLists.wordsAt = byFirstRune(theLists.words)
		theLists.exceptionsAt = byFirstRune(theLists.exceptions)
		for _, at := range []map[rune][]int32{theLists.wordsAt, theLists.exceptionsAt} {
			for r := range at {
				setBit(&theLists.starts, r)
			}
		}
	})
	return &theLists
}

// tabooCategories are the categories of unsuitable.txt whose words no
// 春联 holds in any use: death, illness, grief, parting, ruin, crude words,
// innuendo and war. The others (another occasion, autumn, the prosaic) are
// out of season or style rather than ill-omened.
var tabooCategories = []string{
	"death and funerals",
	"illness and injury",
	"grief and tears, sorrow and resentment",
	"parting and loneliness",
	"ruin, disaster, poverty, decline",
	"crude or vulgar words",
	"innuendo and double meanings",
	"war and fatalism",
}

// category is one "# name" section of unsuitable.txt and its entries.
type category struct {
	name    string
	entries []string
}

// categories splits a list file into its sections: a comment line directly
// followed by an entry names the section that entry opens; entries before
// any such line fall in a section named "".
func categories(txt string) []category {
	var out []category
	comment := ""
	for _, l := range strings.Split(txt, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "":
			comment = ""
		case strings.HasPrefix(l, "#"):
			comment = strings.TrimSpace(strings.TrimPrefix(l, "#"))
		default:
			if comment != "" || len(out) == 0 {
				out = append(out, category{name: comment})
				comment = ""
			}
			out[len(out)-1].entries = append(out[len(out)-1].entries, l)
		}
	}
	return out
}

// entries are a list file's lines less blanks and # comments.
func entries(txt string) []string {
	var out []string
	for _, l := range strings.Split(txt, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// Unsuitable returns the entries of unsuitable.txt that occur in text, in
// list order, each once; nil when there is none. An occurrence that lies
// inside an occurrence of one of the list's exception words (无忧 for 忧)
// does not count. text is one line, a whole couplet or a 横批. Occurrences
// of one entry are taken left to right without overlapping.
func Unsuitable(text string) []string {
	ls := loadLists()
	var masked []bool      // byte offsets covered by an exception occurrence
	var next map[int32]int // entry → where its next occurrence may start
	for i, r := range text {
		if !ls.mayStart(r) {
			continue
		}
		for _, k := range ls.exceptionsAt[r] {
			e := ls.exceptions[k]
			if i < next[k] || !strings.HasPrefix(text[i:], e) {
				continue
			}
			if masked == nil {
				masked = make([]bool, len(text))
				next = map[int32]int{}
			}
			for j := i; j < i+len(e); j++ {
				masked[j] = true
			}
			next[k] = i + len(e)
		}
	}
	clear(next)
	var hits []int32
	for i, r := range text {
		if !ls.mayStart(r) {
			continue
		}
		for _, k := range ls.wordsAt[r] {
			w := ls.words[k]
			if i < next[k] || !strings.HasPrefix(text[i:], w) || slices.Contains(hits, k) {
				continue
			}
			if !allMasked(masked, i, i+len(w)) {
				hits = append(hits, k)
				continue
			}
			if next == nil {
				next = map[int32]int{}
			}
			next[k] = i + len(w)
		}
	}
	if len(hits) == 0 {
		return nil
	}
	slices.Sort(hits)
	out := make([]string, len(hits))
	for j, k := range hits {
		out[j] = ls.words[k]
	}
	return out
}

// Taboo returns the entries of Unsuitable(text) that belong to the
// ill-omened categories (tabooCategories): words a blessing word must not
// hold, since no 春联 can be written with them.
func Taboo(text string) []string {
	ls := loadLists()
	var out []string
	for _, w := range Unsuitable(text) {
		if ls.taboo[w] {
			out = append(out, w)
		}
	}
	return out
}

// byFirstRune indexes entries by their first rune.
func byFirstRune(entries []string) map[rune][]int32 {
	m := map[rune][]int32{}
	for k, e := range entries {
		r, _ := utf8.DecodeRuneInString(e)
		m[r] = append(m[r], int32(k))
	}
	return m
}

func allMasked(m []bool, from, to int) bool {
	if m == nil {
		return false
	}
	for k := from; k < to; k++ {
		if !m[k] {
			return false
		}
	}
	return true
}

// UnsuitableBanner reports whether a 横批 does not belong over a door at
// the Spring Festival: it is one of banners_unsuitable.txt's phrases
// (innuendo, fatalism, another occasion's wish) or contains a word of
// unsuitable.txt.
func UnsuitableBanner(banner string) bool {
	return loadLists().banners[banner] || len(Unsuitable(banner)) > 0
}

// zodiac lists the twelve year animals in cycle order; the Gregorian year
// whose Spring Festival starts the year of the rat has year%12 == 4.
const zodiac = "鼠牛虎兔龙蛇马羊猴鸡狗猪"

// yearAnimal returns the year animal that c names (犬 names 狗), or 0.
func yearAnimal(c rune) rune {
	switch c {
	case '鼠', '牛', '虎', '兔', '龙', '蛇', '马', '羊', '猴', '鸡', '狗', '猪':
		return c
	case '犬':
		return '狗'
	}
	return 0
}

// Year-claim verbs: an animal directly followed by one of these (玉兔迎春,
// 金龙辞岁, 金鸡报晓) says which year arrives or leaves; elsewhere an
// animal is an image (龙凤呈祥, 马到成功, 犬吠) and belongs to no year,
// except after 金 (金猴, 金鸡: in the spring couplets of the corpus these
// name the year, 金猴 280 times, 金鸡 238), which claims the animal's
// year whatever follows.
const (
	leaveVerbs  = "辞送别"
	arriveVerbs = "迎贺献闹报"
)

// FestivalYear is the Gregorian year of the Spring Festival a couplet
// written at t is for: the coming one from March on, else this year's
// (the festival falls between January 21 and February 20, and its
// couplets stay up until the Lantern Festival).
func FestivalYear(t time.Time) int {
	if t.Month() >= time.March {
		return t.Year() + 1
	}
	return t.Year()
}

// YearAnimals returns the animal of the year that the Spring Festival of
// the Gregorian year y starts, and the one it ends: 2027 → 羊, 马.
func YearAnimals(y int) (arriving, leaving rune) {
	a := []rune(zodiac)
	i := ((y-4)%12 + 12) % 12
	return a[i], a[(i+11)%12]
}

// WrongYear returns the year claims of text that do not fit the Spring
// Festival of the Gregorian year y, as the animal and its verb (兔迎, 羊辞),
// the animal and 年 or 岁 (蛇年, 猴岁), or 金 and the animal (金猴); nil
// when there is none. A claim fits when the leaving animal is bid farewell
// (马辞), the arriving one welcomed (羊迎), or either one named with 年, 岁
// or 金.
func WrongYear(text string, y int) []string {
	if !strings.ContainsFunc(text, func(c rune) bool { return yearAnimal(c) != 0 }) {
		return nil // most lines name no animal
	}
	arriving, leaving := YearAnimals(y)
	r := []rune(text)
	var out []string
	for i := 0; i+1 < len(r); i++ {
		a := yearAnimal(r[i])
		if a == 0 {
			continue
		}
		v := r[i+1]
		var wrong bool
		switch {
		case containsRune(leaveVerbs, v):
			wrong = a != leaving
		case containsRune(arriveVerbs, v):
			wrong = a != arriving
		case v == '年' || v == '岁':
			wrong = a != leaving && a != arriving
		case i > 0 && r[i-1] == '金':
			if a != leaving && a != arriving {
				out = append(out, string([]rune{'金', r[i]}))
			}
			continue
		}
		if wrong {
			out = append(out, string([]rune{r[i], v}))
		}
	}
	return out
}

// IsYearAnimal reports whether c is one of the twelve year animals (鼠 … 猪).
func IsYearAnimal(c rune) bool { return c != 0 && yearAnimal(c) == c }

func containsRune(s string, c rune) bool {
	for _, x := range s {
		if x == c {
			return true
		}
	}
	return false
}
