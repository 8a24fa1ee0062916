package weights_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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

// springFrom, when set, makes TestWriteSpringDelta store that model
// directory's weights as the spring model:
//
//	go test ./weights -run TestWriteSpringDelta -spring-from DIR
var springFrom = flag.String("spring-from", "", "model directory whose model.safetensors TestWriteSpringDelta stores as chunlian-spring/model.safetensors.xor")

// TestWriteSpringDelta writes the spring model's delta (only with
// -spring-from) and checks that it decodes back to the file it came from.
func TestWriteSpringDelta(t *testing.T) {
	if *springFrom == "" {
		t.Skip("writes chunlian-spring/model.safetensors.xor only with -spring-from DIR")
	}
	spring, err := os.ReadFile(filepath.Join(*springFrom, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(filepath.Join(weights.DefaultDir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	delta, err := weights.EncodeSpring(base, spring)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := weights.DecodeSpring(base, delta); err != nil || !bytes.Equal(back, spring) {
		t.Fatalf("the delta does not decode back (err %v)", err)
	}
	if err := os.WriteFile(filepath.Join(weights.SpringDir, "model.safetensors.xor"), delta, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes of weights stored in %d", len(spring), len(delta))
}

// TestSpringCodec: DecodeSpring inverts EncodeSpring on random files, and
// refuses deltas of the wrong length, odd sizes and corrupt data.
func TestSpringCodec(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 2, 8, 1000, 1 << 16} {
		base, spring := make([]byte, n), make([]byte, n)
		for i := range base {
			base[i] = byte(r.Uint32())
			spring[i] = base[i]
			if r.IntN(3) == 0 {
				spring[i] ^= byte(r.Uint32())
			}
		}
		delta, err := weights.EncodeSpring(base, spring)
		if err != nil {
			t.Fatal(err)
		}
		back, err := weights.DecodeSpring(base, delta)
		if err != nil || !bytes.Equal(back, spring) {
			t.Fatalf("%d bytes: round trip failed (err %v)", n, err)
		}
		if n >= 8 {
			if _, err := weights.DecodeSpring(base[:n-2], delta); err == nil {
				t.Errorf("%d bytes: a shorter base decoded", n)
			}
			if _, err := weights.DecodeSpring(append(slices.Clone(base), 0, 0), delta); err == nil {
				t.Errorf("%d bytes: a longer base decoded", n)
			}
			bad := slices.Clone(delta)
			bad[len(bad)-1] ^= 1 // the Adler-32 trailer
			if _, err := weights.DecodeSpring(base, bad); err == nil {
				t.Errorf("%d bytes: a corrupt delta decoded", n)
			}
		}
	}
	if _, err := weights.EncodeSpring(make([]byte, 4), make([]byte, 6)); err == nil {
		t.Error("files of different sizes encoded")
	}
	if _, err := weights.DecodeSpring(make([]byte, 3), nil); err == nil {
		t.Error("an odd-sized base decoded")
	}
}

// TestSpringModel: SpringFS serves the spring model's own weights and the
// default model's other files, so the two share a tokenizer and prompt
// contract (model.Compatible) but not their weights.
func TestSpringModel(t *testing.T) {
	for _, name := range []string{"config.json", "tokenizer.json", "chunlian.json", "banner_candidates.txt"} {
		a, err := fs.ReadFile(weights.SpringFS, weights.SpringDir+"/"+name)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := fs.ReadFile(weights.FS, weights.DefaultDir+"/"+name)
		if string(a) != string(b) {
			t.Errorf("%s: the spring model's differs from the default model's", name)
		}
	}
	sw, err := fs.ReadFile(weights.SpringFS, weights.SpringDir+"/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	dw, _ := fs.ReadFile(weights.FS, weights.DefaultDir+"/model.safetensors")
	if len(sw) != len(dw) || bytes.Equal(sw, dw) {
		t.Errorf("spring weights: %d bytes (default %d), equal to the default's: %v", len(sw), len(dw), bytes.Equal(sw, dw))
	}
	f, err := weights.SpringFS.Open(weights.SpringDir + "/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	opened, err := io.ReadAll(f)
	if st, serr := f.Stat(); err != nil || serr != nil || st.Size() != int64(len(sw)) || !bytes.Equal(opened, sw) {
		t.Errorf("Open: %d bytes (err %v), want ReadFile's %d", len(opened), err, len(sw))
	}
	base, err := model.Default()
	if err != nil {
		t.Fatal(err)
	}
	spring, err := model.DefaultSpring()
	if err != nil {
		t.Fatal(err)
	}
	if err := base.Compatible(spring); err != nil {
		t.Error(err)
	}
}
