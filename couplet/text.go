package couplet

import (
	"errors"
	"strings"
)

// ParseText reads the seed's format back (the inverse of Couplet.Text):
// three lines "上联：…", "下联：…", "横批：…". Score is not part of it.
func ParseText(s string) (Couplet, error) {
	lines := strings.Split(s, "\n")
	if len(lines) != 3 {
		return Couplet{}, errors.New("couplet: want three lines 上联/下联/横批")
	}
	var c Couplet
	for i, f := range []struct {
		prefix string
		dst    *string
	}{{"上联：", &c.Upper}, {"下联：", &c.Lower}, {"横批：", &c.Banner}} {
		v, ok := strings.CutPrefix(lines[i], f.prefix)
		if !ok {
			return Couplet{}, errors.New("couplet: line " + string(rune('1'+i)) + " does not start with " + f.prefix)
		}
		*f.dst = v
	}
	return c, nil
}
