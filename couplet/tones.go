package couplet

import (
	"strings"
	"sync"

	"github.com/mozillazg/go-pinyin"
)

// Tone is the 平仄 class of a character under the modern (新声韵) rule:
// Mandarin tones 1 and 2 are 平, tones 3 and 4 are 仄. The class comes from
// the character's primary (first listed, first toned) reading in go-pinyin's
// data, which is mozillazg/pinyin-data; characters without a toned reading
// (or not in the data) are ToneUnknown and never satisfy a tone rule.
type Tone uint8

const (
	ToneUnknown Tone = iota
	TonePing         // 平: tones 1, 2
	ToneZe           // 仄: tones 3, 4
)

func (t Tone) String() string {
	switch t {
	case TonePing:
		return "平"
	case ToneZe:
		return "仄"
	}
	return "?"
}

// toneOfMark maps a tone-carrying pinyin letter (precomposed) or combining
// mark to its tone number 1..4.
var toneOfMark = func() map[rune]int {
	m := map[rune]int{}
	for tone, letters := range []string{
		1: "āēīōūǖ\u0304",
		2: "áéíóúǘńḿế\u0301",
		3: "ǎěǐǒǔǚň\u030c",
		4: "àèìòùǜǹề\u0300",
	} {
		for _, r := range letters {
			m[r] = tone
		}
	}
	return m
}()

// pinyinTone returns the tone number (1..4) of one toned pinyin syllable such
// as "zhōng", or 0 for the neutral tone / unparsable input.
func pinyinTone(syllable string) int {
	for _, r := range syllable {
		if t, ok := toneOfMark[r]; ok {
			return t
		}
	}
	return 0
}

// CharTone returns the 平仄 class of r by its primary reading.
func CharTone(r rune) Tone {
	if t := toneTable(); r >= 0 && int(r) < len(t) {
		return t[r]
	}
	return charTone(r)
}

// toneTable is charTone for every rune below the largest one in the data,
// made on first use: the rules and the ranking ask for every character of
// every candidate, and the data's lookup splits strings.
var toneTable = sync.OnceValue(func() []Tone {
	top := 0
	for k := range pinyin.PinyinDict {
		top = max(top, k)
	}
	t := make([]Tone, top+1)
	for k := range pinyin.PinyinDict {
		t[k] = charTone(rune(k))
	}
	return t
})

// charTone is CharTone's definition, from the data.
func charTone(r rune) Tone {
	readings, ok := pinyin.PinyinDict[int(r)]
	if !ok {
		return ToneUnknown
	}
	// The primary reading is the first one; when it is neutral (子 zi, 了
	// le) the first toned reading stands in, as in the corpus' table.
	for _, r := range strings.Split(readings, ",") {
		switch pinyinTone(r) {
		case 1, 2:
			return TonePing
		case 3, 4:
			return ToneZe
		}
	}
	return ToneUnknown
}
