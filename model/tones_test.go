package model

import (
	"testing"

	"github.com/mozillazg/go-pinyin"
)

// TestSyntheticVocabTones checks the promise that the synthetic test
// vocabulary mixes level (平: Mandarin tones 1–2) and oblique (仄: tones 3–4)
// characters, so couplet rules (仄起平收 etc.) can be met on the random model.
func TestSyntheticVocabTones(t *testing.T) {
	a := pinyin.NewArgs()
	a.Style = pinyin.Tone3
	ping, ze := 0, 0
	for _, r := range testChars {
		py := pinyin.SinglePinyin(r, a)
		if len(py) == 0 {
			continue
		}
		switch py[0][len(py[0])-1] {
		case '1', '2':
			ping++
		case '3', '4':
			ze++
		}
	}
	t.Logf("平 %d, 仄 %d", ping, ze)
	if ping < 100 || ze < 100 {
		t.Errorf("synthetic vocabulary has %d 平 and %d 仄 characters; want ≥ 100 of each", ping, ze)
	}
}
