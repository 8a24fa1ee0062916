package couplet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzValidate: validation never panics, rejects only with *InputError, and
// whatever it accepts generates (fake engine) couplets that obey the rules.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{"平安", "平", "ab", "春回大地，万象更新", "，春", "年年", "\xff", " 吉 祥 ", "春回大地。", "龘龘", strings.Repeat("春", 40)} {
		f.Add(s, uint8(0), int8(0), uint8(1))
		f.Add(s, uint8(1), int8(11), uint8(2))
		f.Add(s, uint8(2), int8(5), uint8(3))
	}
	fe := &fakeEngine{vocab: testModel.Tok.Size()}
	g := newFakeGen(f, fe, WithBannerTopK(2), WithMaxAttempts(2))
	modes := []Mode{ModeKeyword, ModeAcrostic, ModeLower, "", "bogus"}
	f.Fuzz(func(t *testing.T, text string, mode uint8, length int8, n uint8) {
		req := Request{Text: text, Mode: modes[int(mode)%len(modes)], Length: int(length), N: int(n % 4), Seed: 7}
		err := g.Validate(req)
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) || ie.Code == "" || !strings.Contains(ie.Message, " / ") {
				t.Fatalf("%+v: non-input or malformed error %v", req, err)
			}
			return
		}
		cs, err := g.Generate(context.Background(), req)
		if err != nil {
			if errors.Is(err, ErrNoCouplet) {
				return // allowed (bounded attempts), though not expected
			}
			t.Fatalf("%+v: %v", req, err)
		}
		checkResult(t, req, cs)
	})
}

// FuzzNormalize: Normalize is idempotent and keeps valid UTF-8 valid.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"平安", " 平\u3000安\u200b。", "a, b; c!", "春。.。", "\ufeff福"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := Normalize(s)
		if Normalize(n) != n {
			t.Fatalf("not idempotent: %q → %q → %q", s, n, Normalize(n))
		}
		if utf8.ValidString(s) && !utf8.ValidString(n) {
			t.Fatalf("%q normalised to invalid UTF-8", s)
		}
	})
}

// FuzzText: Text/ParseText round-trip for fields without newlines, and
// Check is total and symmetric in the two lines for rules 1 and 3.
func FuzzText(f *testing.F) {
	f.Add("天增岁月人增寿", "春满乾坤福满门", "四季长安")
	f.Add("", "上联：", "\t")
	f.Add("春回大地，万象更新", "福满人间，千家同庆", "五福临门")
	f.Fuzz(func(t *testing.T, u, l, b string) {
		r := Check(u, l, b)
		s := Check(l, u, b)
		if r.Rule1() != s.Rule1() || r.Rule3() != s.Rule3() {
			t.Fatalf("Check not symmetric for %q / %q", u, l)
		}
		if r.OK() && (utf8.RuneCountInString(u) != utf8.RuneCountInString(l) || utf8.RuneCountInString(b) != 4) {
			t.Fatalf("OK for malformed %q / %q / %q", u, l, b)
		}
		c := Couplet{Upper: u, Lower: l, Banner: b}
		back, err := ParseText(c.Text())
		hasNL := strings.Contains(u+l+b, "\n")
		if !hasNL && (err != nil || back != c) {
			t.Fatalf("round trip %+v → %q → %+v, %v", c, c.Text(), back, err)
		}
	})
}
