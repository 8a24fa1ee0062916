package model

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// layoutCase is one case of testdata/prompt_layouts.json, the fixture
// training/test_common.py checks common.prompt_ids and full_ids against.
type layoutCase struct {
	Mode, Keyword, Heads, Upper, Lower, Banner string
	Length                                     int
	Full                                       bool // Sequence (with <eos>), else Prompt
	Tokens                                     []string
}

// TestPromptLayoutsFixture: Prompt and Sequence build exactly the token
// sequences of the shared fixture.
func TestPromptLayoutsFixture(t *testing.T) {
	data, err := os.ReadFile("testdata/prompt_layouts.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []layoutCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 5 {
		t.Fatalf("only %d fixture cases", len(cases))
	}
	m := NewRandom(TestConfig(), 1)
	ids := func(s string) []int32 {
		var out []int32
		for _, r := range s {
			id, ok := m.Tok.ID(string(r))
			if !ok {
				t.Fatalf("test model lacks %q", r)
			}
			out = append(out, id)
		}
		return out
	}
	pt := m.PromptTokens()
	for _, c := range cases {
		heads := ids(c.Keyword + c.Heads)
		lt, ok := m.LengthToken(c.Length)
		if !ok {
			t.Fatalf("no length token for %d", c.Length)
		}
		var got []int32
		if c.Full {
			got, err = pt.Sequence(c.Mode, heads, lt, ids(c.Upper), ids(c.Lower), ids(c.Banner))
		} else {
			got, err = pt.Prompt(c.Mode, heads, lt, ids(c.Upper))
		}
		if err != nil {
			t.Fatal(err)
		}
		toks := make([]string, len(got))
		for i, id := range got {
			toks[i] = m.Tok.Token(id)
		}
		if !slices.Equal(toks, c.Tokens) {
			t.Errorf("%+v:\n got %q\nwant %q", c, toks, c.Tokens)
		}
	}
	if _, err := pt.Prompt("upper", nil, 0, nil); err == nil {
		t.Error("unknown layout accepted")
	}
}
