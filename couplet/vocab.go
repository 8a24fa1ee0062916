package couplet

import (
	"fmt"
)

// Vocab is the part of the tokenizer the couplet package needs; the model
// package's *Tokenizer implements it.
type Vocab interface {
	ID(tok string) (int32, bool)
	Token(id int32) string
	Size() int
}

// tokClass sorts vocabulary ids for the rules.
type tokClass uint8

const (
	classOther tokClass = iota // special, Latin, digits, unknown …: never inside a line
	classHan                   // one Chinese character
	classPunct                 // one couplet punctuation mark
)

// Specials are the ids of the prompt-layout tokens (model/meta.go roles).
type Specials struct {
	BOS, EOS, Keyword, Acrostic, Lower, Up, Sep, Banner int32
	// LengthToken maps a line length in tokens (1..MaxLine) to its <len_N>.
	LengthToken func(n int) (int32, bool)
	MaxLine     int
}

// tables are the per-vocabulary lookup tables, built once per tokenizer and
// read-only afterwards, so every processor (each on the engine goroutine)
// and every Generate call may share them without locks.
type tables struct {
	vocab Vocab
	sp    Specials
	class []tokClass // [vocab] class of each id
	tone  []Tone     // [vocab] 平仄 of each Han id (ToneUnknown otherwise)
	char  []rune     // [vocab] the character of a Han/punct id, 0 otherwise
	han   []int32    // ids of all Han tokens, ascending
	// singles maps a character to the two-character word a one-character
	// keyword is written with (singleWords over the 横批 list; set by New).
	singles map[rune]string
	// judge, when set (by New, from WithJudge), refuses a blessing word
	// holding a taboo word (Judge.Taboo) in prepare.
	judge Judge
	// maxChars is the longest Length whose Layout fits in sp.MaxLine tokens.
	maxChars int
	// The processors' allowed sets (processor.go): Han ids, Han ids of
	// tone 仄, Han ids of tone 平.
	hanSet, zeSet, pingSet idSet
}

func newTables(v Vocab, sp Specials) (*tables, error) {
	n := v.Size()
	if n <= 0 {
		return nil, fmt.Errorf("couplet: empty vocabulary")
	}
	if sp.LengthToken == nil || sp.MaxLine <= 0 {
		return nil, fmt.Errorf("couplet: model has no length tokens")
	}
	t := &tables{vocab: v, sp: sp, class: make([]tokClass, n), tone: make([]Tone, n), char: make([]rune, n)}
	for _, id := range []int32{sp.BOS, sp.EOS, sp.Keyword, sp.Acrostic, sp.Lower, sp.Up, sp.Sep, sp.Banner} {
		if id < 0 || int(id) >= n {
			return nil, fmt.Errorf("couplet: special token id %d out of vocabulary range [0,%d)", id, n)
		}
	}
	special := map[int32]bool{sp.BOS: true, sp.EOS: true, sp.Keyword: true, sp.Acrostic: true, sp.Lower: true, sp.Up: true, sp.Sep: true, sp.Banner: true}
	for id := int32(0); int(id) < n; id++ {
		if special[id] {
			continue
		}
		r, ok := singleRune(v.Token(id))
		if !ok {
			continue
		}
		switch {
		case IsHan(r):
			t.class[id], t.char[id], t.tone[id] = classHan, r, CharTone(r)
		case IsPunct(r):
			t.class[id], t.char[id] = classPunct, r
		}
	}
	t.buildSets()
	t.han = t.hanSet.allow
	ping, ze := len(t.pingSet.allow), len(t.zeSet.allow)
	if ping < 8 || ze < 8 {
		return nil, fmt.Errorf("couplet: vocabulary has too few toned Chinese characters (%d 平, %d 仄)", ping, ze)
	}
	for c := MinLength; ; c++ {
		if len(Layout(c)) > sp.MaxLine {
			break
		}
		if _, ok := sp.LengthToken(len(Layout(c))); !ok {
			break
		}
		t.maxChars = c
	}
	if t.maxChars < MinLength {
		return nil, fmt.Errorf("couplet: model's max line length %d is too short", sp.MaxLine)
	}
	return t, nil
}

// charID returns the id of a single-character token of class Han or punct.
func (t *tables) charID(r rune) (int32, bool) {
	id, ok := t.vocab.ID(string(r))
	if !ok || int(id) >= len(t.class) || t.class[id] == classOther {
		return 0, false
	}
	return id, true
}

// text concatenates the characters of line/banner ids (specials are skipped).
func (t *tables) text(ids []int32) string {
	rs := make([]rune, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && int(id) < len(t.char) && t.char[id] != 0 {
			rs = append(rs, t.char[id])
		}
	}
	return string(rs)
}
