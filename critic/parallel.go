package critic

import (
	_ "embed"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/go-ego/gse"
)

//go:embed words.txt
var wordsTxt string

// charclassTxt holds one line per character: the character then its class
// letter (Class.String), for one-character words.
//
//go:embed charclass.txt
var charclassTxt string

// Class is a coarse part of speech, the unit of 对仗: nouns face nouns,
// verbs verbs, numerals numerals.
type Class byte

// The coarse classes. ClassFunc gathers prepositions, conjunctions,
// particles and interjections; ClassUnknown is a character the dictionary
// does not know.
const (
	ClassUnknown Class = iota
	ClassNoun
	ClassVerb
	ClassAdj
	ClassNum
	ClassAdv
	ClassPron
	ClassFunc
)

func (c Class) String() string {
	return [...]string{"?", "N", "V", "A", "M", "D", "R", "F"}[c]
}

// classOf maps a jieba (ICTCLAS) tag to its coarse class.
func classOf(tag string) Class {
	if tag == "" {
		return ClassUnknown
	}
	switch tag {
	case "x", "eng":
		return ClassUnknown
	case "vn": // verbal noun: 发展, 建设 face nouns as often as verbs
		return ClassNoun
	case "mq", "q", "m":
		return ClassNum
	case "b", "z":
		return ClassAdj
	}
	switch tag[0] {
	case 'n', 's', 't', 'f', 'g', 'j', 'i', 'l':
		return ClassNoun
	case 'v':
		return ClassVerb
	case 'a':
		return ClassAdj
	case 'd':
		return ClassAdv
	case 'r':
		return ClassPron
	}
	return ClassFunc // p c u y e o k h
}

var (
	segOnce   sync.Once
	seg       gse.Segmenter
	charClass map[rune]Class
	han       hanDict
)

// Load loads the segmenter's dictionary now rather than on first use (a
// server calls it at start so the first request does not pay for it).
func Load() {
	segOnce.Do(func() {
		seg, charClass = loadSegmenter()
		han = newHanDict(&seg, charClass)
	})
}

// hanDict is gse's dictionary laid out for segmenting lines of
// ideographs only (every couplet line) without gse's per-call work: each
// character's word of one character and its words of two, with their path
// distances, computed as gse's CalcToken does, and coarse classes.
type hanDict struct {
	at    []int32 // by ideograph (ideographIndex): 1 + index into chars, 0 = none
	chars []hanChar
}

type hanChar struct {
	single hanWord   // its word of one character, if single.ok
	next   []hanNext // words of two characters that it opens, by second rune
	// alone is the class it takes standing alone in a couplet
	// (charclass.txt), if aloneOK: Segment's class for it as a word of one.
	alone   Class
	aloneOK bool
}

type hanWord struct {
	dist  float32
	class Class
	ok    bool
}

type hanNext struct {
	r rune
	w hanWord
}

// newHanDict reads every word of words.txt back from s's dictionary (a
// word listed twice keeps its first entry there, as in gse), and the
// characters' classes alone from cc.
func newHanDict(s *gse.Segmenter, cc map[rune]Class) hanDict {
	h := hanDict{at: make([]int32, numIdeographs)}
	char := func(r rune) *hanChar {
		k := ideographIndex(r)
		if h.at[k] == 0 {
			h.chars = append(h.chars, hanChar{})
			h.at[k] = int32(len(h.chars))
		}
		return &h.chars[h.at[k]-1]
	}
	logTotal := float32(math.Log2(s.Dict.TotalFreq()))
	for _, l := range strings.Split(wordsTxt, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0][0] == '#' {
			continue
		}
		freq, pos, ok := s.Dict.Find([]byte(f[0]))
		if !ok || freq <= 0 {
			continue
		}
		w := hanWord{dist: logTotal - float32(math.Log2(freq)), class: classOf(pos), ok: true}
		switch r := []rune(f[0]); {
		case len(r) == 1 && isIdeograph(r[0]):
			char(r[0]).single = w
		case len(r) == 2 && isIdeograph(r[0]) && isIdeograph(r[1]):
			c := char(r[0])
			c.next = append(c.next, hanNext{r[1], w})
		}
	}
	for r, class := range cc {
		if isIdeograph(r) {
			c := char(r)
			c.alone, c.aloneOK = class, true
		}
	}
	for i := range h.chars {
		c := &h.chars[i]
		slices.SortStableFunc(c.next, func(a, b hanNext) int { return int(a.r - b.r) })
		// A word listed twice was read back twice alike (Find returns
		// its first entry): keep one.
		c.next = slices.CompactFunc(c.next, func(a, b hanNext) bool { return a.r == b.r })
	}
	return h
}

// char returns r's entry, or nil when r opens no word.
func (h *hanDict) char(r rune) *hanChar {
	if k := h.at[ideographIndex(r)]; k > 0 {
		return &h.chars[k-1]
	}
	return nil
}

// pair returns the word of c's character followed by r.
func (c *hanChar) pair(r rune) (hanWord, bool) {
	lo, hi := 0, len(c.next)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c.next[m].r < r {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(c.next) && c.next[lo].r == r {
		return c.next[lo].w, true
	}
	return hanWord{}, false
}

// The ideographs that isIdeograph accepts, numbered from 0.
const numIdeographs = 0x4dbf - 0x3400 + 1 + 0x9fff - 0x4e00 + 1

func ideographIndex(r rune) int {
	if r <= 0x4dbf {
		return int(r - 0x3400)
	}
	return int(r-0x4e00) + 0x4dbf - 0x3400 + 1
}

// isPunct is unicode.IsPunct, answered at once for ideographs (none is).
func isPunct(r rune) bool { return !isIdeograph(r) && unicode.IsPunct(r) }

// isIdeograph: CJK unified ideographs and extension A, each of which gse
// takes as a text unit of its own.
func isIdeograph(r rune) bool { return r >= 0x3400 && r <= 0x4dbf || r >= 0x4e00 && r <= 0x9fff }

// segment is gse's shortest path (segmentWords, not in search mode) over
// line's characters: a word of the dictionary or, where a character is no
// word by itself, that character at distance 32 and class unknown. Ties
// and the float32 sums are gse's. With alone, a word of one character
// takes its class alone where it has one (Segment); else every class is
// the dictionary's (SegmentDict). ok is false, and nothing is done, when
// line is empty or holds anything but ideographs (gse's own path then).
func (h *hanDict) segment(line string, alone bool) (out []Word, ok bool) {
	pick := func(c *hanChar, dict Class) Class {
		if alone && c != nil && c.aloneOK {
			return c.alone
		}
		return dict
	}
	var rs [32]rune
	var offs [33]int // byte offset of each rune, then len(line)
	r, off := rs[:0], offs[:0]
	for i, c := range line {
		if !isIdeograph(c) {
			return nil, false
		}
		r, off = append(r, c), append(off, i)
	}
	off = append(off, len(line))
	n := len(r)
	if n == 0 {
		return nil, false
	}
	type jumper struct {
		dist  float32
		len   int8 // 1 or 2 characters; 0 = none yet
		class Class
	}
	var js [32]jumper
	j := js[:0]
	if n <= len(js) {
		j = js[:n]
	} else {
		j = make([]jumper, n)
	}
	update := func(at int, d float32, k int8, c Class) {
		if j[at].dist == 0 || j[at].dist > d {
			j[at] = jumper{d, k, c}
		}
	}
	for cur := range n {
		var base float32
		if cur > 0 {
			base = j[cur-1].dist
		}
		c := h.char(r[cur])
		if c != nil && c.single.ok {
			update(cur, base+c.single.dist, 1, pick(c, c.single.class))
		}
		if c != nil && cur+1 < n {
			if w2, ok := c.pair(r[cur+1]); ok {
				update(cur+1, base+w2.dist, 2, w2.class)
			}
		}
		if c == nil || !c.single.ok {
			update(cur, base+32, 1, pick(c, ClassUnknown))
		}
	}
	out = make([]Word, 0, n)
	for i := n - 1; i >= 0; i -= int(j[i].len) {
		k := int(j[i].len)
		out = append(out, Word{Text: line[off[i-k+1]:off[i+1]], Class: j[i].class})
	}
	slices.Reverse(out)
	return out, true
}

// loadSegmenter parses the embedded tables (the cost Load pays once).
func loadSegmenter() (s gse.Segmenter, cc map[rune]Class) {
	s.NotLoadHMM = true // unknown characters stay single; no HMM model
	s.SkipLog = true
	var b strings.Builder
	for _, l := range strings.Split(wordsTxt, "\n") {
		if l != "" && l[0] != '#' {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	// LoadDictStr fails only on an empty dictionary; words.txt is not.
	_ = s.LoadDictStr(b.String())
	cc = map[rune]Class{}
	for _, l := range strings.Split(charclassTxt, "\n") {
		r := []rune(l)
		if len(r) != 2 || r[0] == '#' {
			continue
		}
		if c := strings.IndexRune("?NVAMDRF", r[1]); c > 0 {
			cc[r[0]] = Class(c)
		}
	}
	return s, cc
}

// Word is one segment of a line: its characters and coarse class.
type Word struct {
	Text  string
	Class Class
}

// Segment splits a line into words of one or two characters (the
// dictionary holds no longer ones: a couplet's rhythm and its 对仗 are in
// units of one or two characters) by gse's shortest path over word
// frequencies. A two-character word has the coarse class of its
// dictionary tag; a one-character word the class it takes in couplets
// (charclass.txt), else its dictionary tag's. Punctuation and unknown
// characters are words of their own (gse lowercases Latin letters and
// keeps a run of them as one word).
func Segment(line string) []Word {
	Load()
	if ws, ok := han.segment(line, true); ok {
		return ws
	}
	return withClassAlone(gseSegment(line))
}

// withClassAlone gives each word of one character of ws its class alone
// (charclass.txt) where it has one.
func withClassAlone(ws []Word) []Word {
	for i, w := range ws {
		if r, size := utf8.DecodeRuneInString(w.Text); size > 0 && size == len(w.Text) {
			if c, ok := charClass[r]; ok {
				ws[i].Class = c
			}
		}
	}
	return ws
}

// SegmentDict is Segment with every class from the dictionary's tags.
func SegmentDict(line string) []Word {
	Load()
	if ws, ok := han.segment(line, false); ok {
		return ws
	}
	return gseSegment(line)
}

// gseSegment is SegmentDict through gse itself.
func gseSegment(line string) []Word {
	segs := seg.Segment([]byte(line))
	out := make([]Word, 0, len(segs))
	for _, s := range segs {
		t := s.Token()
		out = append(out, Word{Text: t.Text(), Class: classOf(t.Pos())})
	}
	return out
}

// OpensWord reports whether line's first character opens a word of two
// characters as SegmentDict splits the line (春风… yes; 业羊…, 丽回… no): what
// an acrostic couplet's head needs to read naturally.
func OpensWord(line string) bool {
	ws := SegmentDict(line)
	return len(ws) > 0 && utf8.RuneCountInString(ws[0].Text) >= 2
}

// Parallelism scores how well the two lines face each other, in [0, 1]:
// the mean of boundary agreement and class agreement.
//
// Both lines are segmented (Segment). Boundary agreement is the share of
// the n−1 gaps between characters where both lines have a word boundary
// or neither has. Class agreement is the share of the n character
// positions whose words in the two lines have the same coarse class; a
// position where either word's class is unknown counts one half. A
// punctuation mark is a word of its own: the same mark at the same
// position agrees in both measures, a mark facing a character agrees in
// neither.
//
// Lines of different length (in characters) score 0; lines of one
// character score their class agreement alone.
func Parallelism(upper, lower string) float64 {
	u, l := []rune(upper), []rune(lower)
	n := len(u)
	if n == 0 || n != len(l) {
		return 0
	}
	ub, uc := layout(Segment(upper), n)
	lb, lc := layout(Segment(lower), n)
	var cls float64
	for i := 0; i < n; i++ {
		switch pu, pl := isPunct(u[i]), isPunct(l[i]); {
		case pu || pl:
			if u[i] == l[i] {
				cls++
			}
		case uc[i] == ClassUnknown || lc[i] == ClassUnknown:
			cls += 0.5
		case uc[i] == lc[i]:
			cls++
		}
	}
	cls /= float64(n)
	if n == 1 {
		return cls
	}
	bnd := 0
	for i := 1; i < n; i++ {
		if ub[i] == lb[i] {
			bnd++
		}
	}
	return (float64(bnd)/float64(n-1) + cls) / 2
}

// layout returns, per character position, whether a word starts there and
// the class of the word that covers it.
func layout(ws []Word, n int) (start []bool, class []Class) {
	start = make([]bool, n)
	class = make([]Class, n)
	i := 0
	for _, w := range ws {
		k := utf8.RuneCountInString(w.Text)
		if i < n {
			start[i] = true
		}
		for j := 0; j < k && i < n; j++ {
			class[i] = w.Class
			i++
		}
	}
	return start, class
}
