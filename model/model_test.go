package model

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/mozillazg/go-pinyin"
)

func TestRandomModelValid(t *testing.T) {
	m := NewRandom(TestConfig(), 1)
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := m.Tok.Size(); got != m.Config.VocabSize {
		t.Fatalf("tokenizer size %d, vocab %d", got, m.Config.VocabSize)
	}
	if m.Tok.Size() < 400 {
		t.Errorf("synthetic vocabulary has only %d tokens, want ≥ 400", m.Tok.Size())
	}
	for _, w := range []string{"平安", "富贵", "吉祥", "如意", "春", "福", "新", "年", "喜", "庆", "，", "、", "；", "：", "！", "？", "·"} {
		if _, err := m.Tok.Encode(w); err != nil {
			t.Errorf("Encode(%q): %v", w, err)
		}
	}
	for n := 1; n <= 32; n++ {
		if _, ok := m.LengthToken(n); !ok {
			t.Errorf("LengthToken(%d) missing", n)
		}
	}
	for _, n := range []int{0, -1, 33} {
		if _, ok := m.LengthToken(n); ok {
			t.Errorf("LengthToken(%d) should not exist", n)
		}
	}
	for _, role := range Roles {
		id := m.Special(role)
		if id < 0 || !m.Tok.IsSpecial(id) {
			t.Errorf("Special(%q) = %d, special=%v", role, id, m.Tok.IsSpecial(id))
		}
	}
	if m.Special("nope") != -1 {
		t.Error("unknown role should give -1")
	}
	// Determinism: the same seed gives the same bits, another seed does not.
	a, b, c := NewRandom(TestConfig(), 7), NewRandom(TestConfig(), 7), NewRandom(TestConfig(), 8)
	if !reflect.DeepEqual(a.Weights, b.Weights) {
		t.Error("same seed, different weights")
	}
	if reflect.DeepEqual(a.Weights.Layers[0].Wq, c.Weights.Layers[0].Wq) {
		t.Error("different seeds, same weights")
	}
}

func TestNewRandomLargerVocab(t *testing.T) {
	cfg := TestConfig()
	cfg.VocabSize += 100
	m := NewRandom(cfg, 1)
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	last := int32(cfg.VocabSize - 1)
	if !m.Tok.IsSpecial(last) || m.Tok.Token(last) == "" {
		t.Errorf("padding token %d = %q, special %v", last, m.Tok.Token(last), m.Tok.IsSpecial(last))
	}
}

func TestWriteDirLoadRoundTrip(t *testing.T) {
	for _, tied := range []bool{false, true} {
		cfg := TestConfig()
		cfg.TieWordEmbeddings = tied
		m := NewRandom(cfg, 3)
		dir := filepath.Join(t.TempDir(), "rt-model")
		if err := WriteDir(m, dir); err != nil {
			t.Fatal(err)
		}
		got, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "rt-model" {
			t.Errorf("Name = %q", got.Name)
		}
		if got.Config != m.Config {
			t.Errorf("tied=%v config:\n got %+v\nwant %+v", tied, got.Config, m.Config)
		}
		if !reflect.DeepEqual(got.Weights, m.Weights) {
			t.Errorf("tied=%v: weights differ after round trip", tied)
		}
		if tied && &got.Weights.LMHead[0] != &got.Weights.Embed[0] {
			t.Error("tied model should share Embed and LMHead")
		}
		if !reflect.DeepEqual(got.Meta, m.Meta) {
			t.Errorf("meta differs: %+v vs %+v", got.Meta, m.Meta)
		}
		for id := int32(0); id < int32(m.Tok.Size()); id++ {
			if got.Tok.Token(id) != m.Tok.Token(id) || got.Tok.IsSpecial(id) != m.Tok.IsSpecial(id) {
				t.Fatalf("token %d: %q/%v vs %q/%v", id, got.Tok.Token(id), got.Tok.IsSpecial(id), m.Tok.Token(id), m.Tok.IsSpecial(id))
			}
		}
	}
}

// writeFile rewrites one file of a model dir, for the error cases below.
func editJSON(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	edit(v)
	if b, err = json.Marshal(v); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadErrors(t *testing.T) {
	base := filepath.Join(t.TempDir(), "base")
	if err := WriteDir(NewRandom(TestConfig(), 5), base); err != nil {
		t.Fatal(err)
	}
	copyDir := func(t *testing.T) string {
		dir := t.TempDir()
		for _, f := range []string{"config.json", "tokenizer.json", "chunlian.json", "model.safetensors"} {
			b, err := os.ReadFile(filepath.Join(base, f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	cases := []struct {
		name    string
		break_  func(t *testing.T, dir string)
		wantErr string
	}{
		{"missing tokenizer", func(t *testing.T, d string) { os.Remove(filepath.Join(d, "tokenizer.json")) }, "tokenizer.json"},
		{"missing weights", func(t *testing.T, d string) { os.Remove(filepath.Join(d, "model.safetensors")) }, "model.safetensors"},
		{"bad config json", func(t *testing.T, d string) { os.WriteFile(filepath.Join(d, "config.json"), []byte("{"), 0o644) }, "config.json"},
		{"rope scaling", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(v map[string]any) { v["rope_scaling"] = map[string]any{"type": "linear", "factor": 2} })
		}, "rope_scaling"},
		{"rope_parameters type", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(v map[string]any) {
				v["rope_parameters"] = map[string]any{"rope_type": "yarn", "rope_theta": 10000}
			})
		}, "rope_type"},
		{"attention bias", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(v map[string]any) { v["attention_bias"] = true })
		}, "attention_bias"},
		{"mlp bias", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(v map[string]any) { v["mlp_bias"] = true })
		}, "mlp_bias"},
		{"architecture", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(v map[string]any) { v["architectures"] = []string{"GPT2LMHeadModel"} })
		}, "LlamaForCausalLM"},
		{"shape mismatch", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(v map[string]any) { v["intermediate_size"] = 100 })
		}, "gate_proj"},
		{"GQA mismatch", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(v map[string]any) { v["num_key_value_heads"] = 3 })
		}, "multiple"},
		{"tied but lm_head differs", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "config.json"), func(v map[string]any) { v["tie_word_embeddings"] = true })
		}, "differs"},
		{"special token missing", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "chunlian.json"), func(v map[string]any) { v["special_tokens"].(map[string]any)["sep"] = "<nosuch>" })
		}, "sep"},
		{"length token pattern", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "chunlian.json"), func(v map[string]any) { v["length_token"] = "<len>" })
		}, "length_token"},
		{"length token range", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "chunlian.json"), func(v map[string]any) { v["max_line_length"] = 40 })
		}, "<len_33>"},
		{"untied without lm_head", func(t *testing.T, d string) {
			m := NewRandom(TestConfig(), 5)
			m.Config.TieWordEmbeddings = true
			m.Weights.LMHead = m.Weights.Embed
			if err := WriteDir(m, d); err != nil {
				t.Fatal(err)
			}
			editJSON(t, filepath.Join(d, "config.json"), func(v map[string]any) { v["tie_word_embeddings"] = false })
		}, "lm_head.weight missing"},
		{"not WordLevel", func(t *testing.T, d string) {
			editJSON(t, filepath.Join(d, "tokenizer.json"), func(v map[string]any) { v["model"].(map[string]any)["type"] = "BPE" })
		}, "WordLevel"},
		{"truncated safetensors", func(t *testing.T, d string) {
			p := filepath.Join(d, "model.safetensors")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)/2], 0o644)
		}, "model.safetensors"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDir(t)
			tc.break_(t, dir)
			_, err := Load(dir)
			if err == nil {
				t.Fatal("Load succeeded on a broken dir")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not mention %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseConfigDefaults(t *testing.T) {
	cases := []struct {
		name, json string
		want       Config
	}{
		{"transformers 4", `{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"rope_theta":500000,"rms_norm_eps":1e-5}`,
			Config{VocabSize: 10, HiddenSize: 8, IntermediateSize: 16, NumLayers: 1, NumHeads: 2, NumKVHeads: 2, HeadDim: 4, RopeTheta: 500000, RMSNormEps: 1e-5}},
		{"transformers 5 rope_parameters", `{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"rope_parameters":{"rope_theta":20000,"rope_type":"default"}}`,
			Config{VocabSize: 10, HiddenSize: 8, IntermediateSize: 16, NumLayers: 1, NumHeads: 2, NumKVHeads: 1, HeadDim: 4, RopeTheta: 20000, RMSNormEps: 1e-6}},
		{"no theta anywhere", `{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"head_dim":2,"rope_scaling":null}`,
			Config{VocabSize: 10, HiddenSize: 8, IntermediateSize: 16, NumLayers: 1, NumHeads: 2, NumKVHeads: 2, HeadDim: 2, RopeTheta: 10000, RMSNormEps: 1e-6}},
	}
	for _, tc := range cases {
		got, err := ParseConfig([]byte(tc.json))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

func TestDefault(t *testing.T) {
	m, err := Default()
	if errors.Is(err, ErrNoDefault) {
		t.Skip("default model not embedded")
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	again, _ := Default()
	if again != m {
		t.Error("Default should load once and share the model")
	}
	if m.Name != "chunlian-base" {
		t.Errorf("Name = %q", m.Name)
	}
	ids, err := m.Tok.Encode("<bos><kw>平安<len_7><up>")
	if err != nil || len(ids) != 6 || ids[0] != m.Special("bos") || ids[5] != m.Special("up") {
		t.Errorf("Encode prompt = %v, %v", ids, err)
	}
	if got := m.Tok.Decode(ids); got != "平安" {
		t.Errorf("Decode = %q", got)
	}
}

// BenchmarkLoadDefault measures loading the embedded model (parse +
// bf16→float32), i.e. the start-up cost of `chunlian serve`.
func BenchmarkLoadDefault(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := loadDefaultUncached(); err != nil {
			b.Skip(err)
		}
	}
}

func TestFused(t *testing.T) {
	m := NewRandom(TestConfig(), 2)
	l := &m.Weights.Layers[1]
	want := func(parts ...[]float32) []float32 {
		var out []float32
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	qkv, gu := l.Fused()
	if !reflect.DeepEqual(qkv, want(l.Wq, l.Wk, l.Wv)) || !reflect.DeepEqual(gu, want(l.WGate, l.WUp)) {
		t.Fatal("fused matrices are not the stacked ones")
	}
	if &qkv[0] != &l.Wq[0] || &gu[0] != &l.WGate[0] {
		t.Error("a packed layer should give views, not copies")
	}
	// An unpacked layer (separately allocated matrices) gets copies.
	u := Layer{Wq: append([]float32(nil), l.Wq...), Wk: append([]float32(nil), l.Wk...), Wv: append([]float32(nil), l.Wv...),
		WGate: append([]float32(nil), l.WGate...), WUp: append([]float32(nil), l.WUp...)}
	qkv2, gu2 := u.Fused()
	if !reflect.DeepEqual(qkv2, qkv) || !reflect.DeepEqual(gu2, gu) || &qkv2[0] == &u.Wq[0] {
		t.Error("unpacked layer: wrong fused copy")
	}
	// Adjacent in memory but in the wrong order is not a view.
	arena := want(l.Wk, l.Wq, l.Wv)
	nk := len(l.Wk)
	sw := Layer{Wk: arena[:nk], Wq: arena[nk : nk+len(l.Wq)], Wv: arena[nk+len(l.Wq):], WGate: l.WGate, WUp: l.WUp}
	if q3, _ := sw.Fused(); !reflect.DeepEqual(q3, qkv) {
		t.Error("swapped layout gave a wrong fused matrix")
	}
}

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

// TestCompatible: models that share tokenizer and chunlian.json are
// compatible whatever their weights; a different token or prompt layout
// is named.
func TestCompatible(t *testing.T) {
	a, b := NewRandom(TestConfig(), 1), NewRandom(TestConfig(), 2)
	if err := a.Compatible(b); err != nil {
		t.Fatalf("same vocabulary, other weights: %v", err)
	}
	c := NewRandom(TestConfig(), 3)
	c.Tok.tokens = append([]string(nil), c.Tok.tokens...)
	c.Tok.tokens[len(c.Tok.tokens)-1] = "X"
	if err := a.Compatible(c); err == nil || !strings.Contains(err.Error(), "tokenizer") {
		t.Errorf("a changed token: %v, want a tokenizer error", err)
	}
	d := NewRandom(TestConfig(), 4)
	d.Meta.Layouts = map[string]string{"keyword": "<bos> <kw> {keyword}"}
	if err := a.Compatible(d); err == nil || !strings.Contains(err.Error(), "chunlian.json") {
		t.Errorf("a changed layout: %v, want a chunlian.json error", err)
	}
}
