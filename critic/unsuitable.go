package critic

import (
	_ "embed"
	"strings"
	"sync"
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
	banners    map[string]bool
}

var (
	listsOnce sync.Once
	theLists  lists
)

func loadLists() *lists {
	listsOnce.Do(func() {
		theLists.banners = map[string]bool{}
		for _, l := range entries(unsuitableTxt) {
			if strings.HasPrefix(l, "!") {
				theLists.exceptions = append(theLists.exceptions, l[1:])
			} else {
				theLists.words = append(theLists.words, l)
			}
		}
		for _, l := range entries(bannersUnsuitableTxt) {
			theLists.banners[l] = true
		}
	})
	return &theLists
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
// does not count. text is one line, a whole couplet or a 横批.
func Unsuitable(text string) []string {
	ls := loadLists()
	var masked []bool // byte offsets covered by an exception occurrence
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
