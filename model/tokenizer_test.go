package model

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// A tokenizer.json as HF tokenizers writes it for a char-level WordLevel
// model: specials both in vocab and added_tokens, one multi-char special
// that is not in vocab.
const smallTokenizer = `{
  "version": "1.0",
  "added_tokens": [
    {"id":0,"content":"<pad>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
    {"id":1,"content":"<unk>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
    {"id":2,"content":"<bos>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
    {"id":3,"content":"<len_1>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
    {"id":4,"content":"<len_12>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}
  ],
  "normalizer": null,
  "pre_tokenizer": {"type":"Split","pattern":{"Regex":"."},"behavior":"Isolated","invert":false},
  "model": {"type":"WordLevel","vocab":{"<pad>":0,"<unk>":1,"<bos>":2,"<len_1>":3,"春":5,"福":6,"，":7,"<":8,"a":9},"unk_token":"<unk>"}
}`

func TestTokenizerEncodeDecode(t *testing.T) {
	tok, err := ParseTokenizer([]byte(smallTokenizer))
	if err != nil {
		t.Fatal(err)
	}
	if tok.Size() != 10 {
		t.Errorf("Size = %d, want 10", tok.Size())
	}
	cases := []struct {
		text    string
		want    []int32
		decoded string
		unknown []string // nil: no error
	}{
		{"春福", []int32{5, 6}, "春福", nil},
		{"", []int32{}, "", nil},
		{"<bos>春，福", []int32{2, 5, 7, 6}, "春，福", nil},
		{"<len_12>春<len_1>", []int32{4, 5, 3}, "春", nil}, // longest added token wins
		{"<a春", []int32{8, 9, 5}, "<a春", nil},            // a plain '<' is a character
		{"春天好福天", nil, "", []string{"天", "好"}},           // each unknown char once, in order
		{"春 福", nil, "", []string{" "}},                  // spaces are not silently dropped
		{"春\xff", nil, "", []string{`"\xff"`}},           // invalid UTF-8 named
	}
	for _, tc := range cases {
		got, err := tok.Encode(tc.text)
		if tc.unknown != nil {
			var ue *UnknownCharsError
			if !errors.As(err, &ue) || !reflect.DeepEqual(ue.Chars, tc.unknown) {
				t.Errorf("Encode(%q) err = %v, want unknown %q", tc.text, err, tc.unknown)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Encode(%q) = %v, %v; want %v", tc.text, got, err, tc.want)
			continue
		}
		if d := tok.Decode(got); d != tc.decoded {
			t.Errorf("Decode(Encode(%q)) = %q, want %q", tc.text, d, tc.decoded)
		}
	}
	for _, c := range []struct {
		id      int32
		text    string
		special bool
	}{{0, "<pad>", true}, {4, "<len_12>", true}, {5, "春", false}, {8, "<", false}, {-1, "", false}, {10, "", false}} {
		if tok.Token(c.id) != c.text || tok.IsSpecial(c.id) != c.special {
			t.Errorf("id %d: %q special=%v, want %q %v", c.id, tok.Token(c.id), tok.IsSpecial(c.id), c.text, c.special)
		}
	}
	if id, ok := tok.ID("福"); !ok || id != 6 {
		t.Errorf("ID(福) = %d, %v", id, ok)
	}
	if _, ok := tok.ID("天"); ok {
		t.Error("ID(天) found")
	}
	if d := tok.Decode([]int32{5, 99, -3, 6}); d != "春福" {
		t.Errorf("Decode skips out-of-range ids: got %q", d)
	}
}

func TestParseTokenizerErrors(t *testing.T) {
	cases := []struct{ name, json, want string }{
		{"not json", `{"model":`, "tokenizer.json"},
		{"bpe", `{"model":{"type":"BPE","vocab":{"a":0}}}`, "WordLevel"},
		{"empty vocab", `{"model":{"type":"WordLevel","vocab":{}}}`, "empty"},
		{"negative id", `{"model":{"type":"WordLevel","vocab":{"a":-1}}}`, "negative"},
		{"two texts one id", `{"model":{"type":"WordLevel","vocab":{"a":0,"b":0}}}`, "two tokens"},
		{"added conflicts", `{"added_tokens":[{"id":3,"content":"a","special":true}],"model":{"type":"WordLevel","vocab":{"a":0}}}`, "two ids"},
		{"empty text", `{"model":{"type":"WordLevel","vocab":{"":0}}}`, "empty token"},
	}
	for _, tc := range cases {
		_, err := ParseTokenizer([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want mention of %q", tc.name, err, tc.want)
		}
	}
}

func TestTokenizerJSONRoundTrip(t *testing.T) {
	tok, err := ParseTokenizer([]byte(smallTokenizer))
	if err != nil {
		t.Fatal(err)
	}
	b, err := tok.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseTokenizer(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, tok) {
		t.Errorf("round trip changed the tokenizer:\n%+v\n%+v", back, tok)
	}
}

func TestHalfToFloat32(t *testing.T) {
	cases := []struct {
		h    uint16
		want float32
	}{
		{0x0000, 0}, {0x3c00, 1}, {0xc000, -2}, {0x3555, 0.333251953125},
		{0x7bff, 65504}, {0x0001, 5.960464477539063e-08}, {0x03ff, 6.097555160522461e-05},
		{0x8001, -5.960464477539063e-08},
	}
	for _, c := range cases {
		if got := halfToFloat32(c.h); got != c.want {
			t.Errorf("half %#04x = %g, want %g", c.h, got, c.want)
		}
	}
}
