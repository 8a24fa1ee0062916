package weights_test

import (
	"encoding/json"
	"io/fs"
	"strings"
	"testing"
	"unicode/utf8"

	"chunlian/model"
	"chunlian/weights"
)

// TestEmbeddedFiles checks that every file of the contract is embedded and
// non-empty, and that the shipped weights stay within the 40 MB budget.
func TestEmbeddedFiles(t *testing.T) {
	for _, tc := range []struct {
		name     string
		minBytes int
		maxBytes int
	}{
		{"config.json", 100, 10_000},
		{"model.safetensors", 1_000_000, 40_000_000},
		{"tokenizer.json", 1_000, 1_000_000},
		{"generation_config.json", 10, 10_000},
		{"chunlian.json", 100, 10_000},
		{"banner_candidates.txt", 100, 1_000_000},
	} {
		b, err := fs.ReadFile(weights.FS, weights.DefaultDir+"/"+tc.name)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if len(b) < tc.minBytes || len(b) > tc.maxBytes {
			t.Errorf("%s: %d bytes, want %d..%d", tc.name, len(b), tc.minBytes, tc.maxBytes)
		}
	}
}

// TestLoadsAndMatchesContract loads the embedded directory with package
// model and checks the chunlian.json contract against the tokenizer.
func TestLoadsAndMatchesContract(t *testing.T) {
	m, err := model.LoadFS(weights.FS, weights.DefaultDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if m.Tok.Size() != m.Config.VocabSize {
		t.Errorf("tokenizer has %d tokens, config vocab_size %d", m.Tok.Size(), m.Config.VocabSize)
	}
	for _, role := range model.Roles {
		if id := m.Special(role); id < 0 {
			t.Errorf("role %q has no token", role)
		}
	}
	for n := 1; n <= m.Meta.MaxLineLength; n++ {
		if _, ok := m.LengthToken(n); !ok {
			t.Errorf("no length token for %d", n)
		}
	}
	// Layout strings name only known special tokens and placeholders.
	for mode, layout := range m.Meta.Layouts {
		for _, item := range strings.Fields(layout) {
			if strings.HasPrefix(item, "{") {
				continue
			}
			if _, ok := m.Tok.ID(item); !ok {
				t.Errorf("layout %s: unknown token %q", mode, item)
			}
		}
	}
}

// TestBannerCandidates checks the shipped 横批 list: four CJK characters a
// line, no duplicates, every character in the vocabulary.
func TestBannerCandidates(t *testing.T) {
	b, err := fs.ReadFile(weights.FS, weights.DefaultDir+"/banner_candidates.txt")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := fs.ReadFile(weights.FS, weights.DefaultDir+"/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var tj struct {
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if utf8.RuneCountInString(line) != 4 {
			t.Errorf("line %d %q: not 4 characters", i+1, line)
		}
		if seen[line] {
			t.Errorf("line %d %q: duplicate", i+1, line)
		}
		seen[line] = true
		for _, r := range line {
			if _, ok := tj.Model.Vocab[string(r)]; !ok {
				t.Errorf("line %d %q: %q not in the vocabulary", i+1, line, r)
			}
		}
	}
	if len(seen) < 100 {
		t.Errorf("only %d candidates", len(seen))
	}
}
