package model_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/nlpodyssey/safetensors"

	"chunlian/forward"
	"chunlian/model"
)

var (
	baseOnce  sync.Once
	baseFiles map[string][]byte
	baseErr   error
)

// baseDir returns the four files of a valid tiny random model directory.
func baseDir(t testing.TB) map[string][]byte {
	baseOnce.Do(func() {
		dir, err := os.MkdirTemp("", "chunlian-untrusted")
		if err != nil {
			baseErr = err
			return
		}
		defer os.RemoveAll(dir)
		cfg := model.TestConfig()
		// as small as the synthetic vocabulary allows: the fuzzer mutates
		// every byte of these files
		cfg.NumLayers, cfg.HiddenSize, cfg.NumHeads, cfg.NumKVHeads, cfg.HeadDim, cfg.IntermediateSize = 1, 8, 2, 1, 4, 16
		if baseErr = model.WriteDir(model.NewRandom(cfg, 3), dir); baseErr != nil {
			return
		}
		baseFiles = map[string][]byte{}
		for _, f := range []string{"config.json", "tokenizer.json", "chunlian.json", "model.safetensors"} {
			if baseFiles[f], baseErr = os.ReadFile(filepath.Join(dir, f)); baseErr != nil {
				return
			}
		}
	})
	if baseErr != nil {
		t.Fatal(baseErr)
	}
	out := map[string][]byte{}
	for k, v := range baseFiles {
		out[k] = v
	}
	return out
}

// editJSONBytes applies edit to a JSON object.
func editJSONBytes(t testing.TB, b []byte, edit func(map[string]any)) []byte {
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	edit(v)
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// zeroTensors serialises F32 tensors of the given shapes, all zeros.
func zeroTensors(t testing.TB, shapes map[string][]uint64) []byte {
	ts := map[string]safetensors.TensorView{}
	for name, shape := range shapes {
		n := uint64(4)
		for _, s := range shape {
			n *= s
		}
		tv, err := safetensors.NewTensorView(safetensors.F32, shape, make([]byte, n))
		if err != nil {
			t.Fatal(err)
		}
		ts[name] = tv
	}
	var buf bytes.Buffer
	if err := safetensors.SerializeToWriter(ts, nil, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// loadFiles loads files as a model directory and, when that succeeds,
// builds the CPU forward pass on it (where the reported crashes happened).
func loadFiles(files map[string][]byte) (*model.Model, error) {
	fsys := fstest.MapFS{}
	for k, v := range files {
		fsys[k] = &fstest.MapFile{Data: v}
	}
	m, err := model.LoadFS(fsys, ".")
	if err != nil {
		return nil, err
	}
	if _, err := forward.NewCPU(m, forward.CPUOptions{KVCacheBytes: 1 << 20}); err != nil {
		return nil, err
	}
	return m, nil
}

// overflowHeads is the reported division-by-zero case: 2³² heads of 2³²
// dimensions make QDim and KVDim wrap to 0, and zero-size q/k/v/o
// tensors then match those shapes.
func overflowHeads(t testing.TB, files map[string][]byte) {
	const big = uint64(1) << 32
	files["config.json"] = editJSONBytes(t, files["config.json"], func(v map[string]any) {
		v["num_attention_heads"], v["num_key_value_heads"], v["head_dim"] = big, big, big
	})
	var c struct {
		V   uint64 `json:"vocab_size"`
		D   uint64 `json:"hidden_size"`
		FFN uint64 `json:"intermediate_size"`
	}
	if err := json.Unmarshal(files["config.json"], &c); err != nil {
		t.Fatal(err)
	}
	p := "model.layers.0."
	files["model.safetensors"] = zeroTensors(t, map[string][]uint64{
		"model.embed_tokens.weight": {c.V, c.D}, "lm_head.weight": {c.V, c.D}, "model.norm.weight": {c.D},
		p + "input_layernorm.weight": {c.D}, p + "post_attention_layernorm.weight": {c.D},
		p + "self_attn.q_proj.weight": {0, c.D}, p + "self_attn.k_proj.weight": {0, c.D},
		p + "self_attn.v_proj.weight": {0, c.D}, p + "self_attn.o_proj.weight": {c.D, 0},
		p + "mlp.gate_proj.weight": {c.FFN, c.D}, p + "mlp.up_proj.weight": {c.FFN, c.D},
		p + "mlp.down_proj.weight": {c.D, c.FFN},
	})
}

func hugeLayers(t testing.TB, files map[string][]byte) {
	files["config.json"] = editJSONBytes(t, files["config.json"], func(v map[string]any) { v["num_hidden_layers"] = 100000000 })
}

func hugeTokenID(t testing.TB, files map[string][]byte) {
	files["tokenizer.json"] = editJSONBytes(t, files["tokenizer.json"], func(v map[string]any) {
		v["model"].(map[string]any)["vocab"].(map[string]any)["<huge>"] = 2147483646
	})
}

// TestLoadUntrustedDir checks each crash the reliability probe reported
// (and neighbours) fails with one error naming the file and the field.
func TestLoadUntrustedDir(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(testing.TB, map[string][]byte)
		wants []string
	}{
		{"heads×head_dim overflows to 0", overflowHeads, []string{"config.json", "num_attention_heads"}},
		{"num_hidden_layers 100000000", hugeLayers, []string{"config.json", "num_hidden_layers 100000000"}},
		{"token id 2147483646", hugeTokenID, []string{"tokenizer.json", "2147483646"}},
		{"token id past vocab_size", func(t testing.TB, f map[string][]byte) {
			f["tokenizer.json"] = editJSONBytes(t, f["tokenizer.json"], func(v map[string]any) {
				v["model"].(map[string]any)["vocab"].(map[string]any)["<far>"] = 100000
			})
		}, []string{"tokenizer.json", "vocab_size"}},
		{"hidden_size huge", func(t testing.TB, f map[string][]byte) {
			f["config.json"] = editJSONBytes(t, f["config.json"], func(v map[string]any) { v["hidden_size"] = 1 << 40 })
		}, []string{"config.json", "hidden_size"}},
		{"negative max_position_embeddings", func(t testing.TB, f map[string][]byte) {
			f["config.json"] = editJSONBytes(t, f["config.json"], func(v map[string]any) { v["max_position_embeddings"] = -1 })
		}, []string{"config.json", "max_position_embeddings"}},
		{"config larger than the weights file", func(t testing.TB, f map[string][]byte) {
			f["config.json"] = editJSONBytes(t, f["config.json"], func(v map[string]any) { v["num_hidden_layers"] = 200 })
		}, []string{"model.safetensors", "parameters"}},
		{"max_line_length huge", func(t testing.TB, f map[string][]byte) {
			f["chunlian.json"] = editJSONBytes(t, f["chunlian.json"], func(v map[string]any) { v["max_line_length"] = 1 << 30 })
		}, []string{"chunlian.json", "max_line_length"}},
		{"length_token with another verb", func(t testing.TB, f map[string][]byte) {
			f["chunlian.json"] = editJSONBytes(t, f["chunlian.json"], func(v map[string]any) { v["length_token"] = "<%s_%d>" })
		}, []string{"chunlian.json", "length_token"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			files := baseDir(t)
			tc.edit(t, files)
			_, err := loadFiles(files)
			if err == nil {
				t.Fatal("a malformed model directory loaded")
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// FuzzLoadModelDir feeds arbitrary config.json, tokenizer.json,
// chunlian.json and model.safetensors to the loader (and the CPU forward
// pass when loading succeeds): neither may panic, and any accepted model
// must pass Validate. The seeds (a valid tiny model and the reported crash
// cases) run in plain go test.
func FuzzLoadModelDir(f *testing.F) {
	add := func(edit func(testing.TB, map[string][]byte)) {
		files := baseDir(f)
		if edit != nil {
			edit(f, files)
		}
		f.Add(files["config.json"], files["tokenizer.json"], files["chunlian.json"], files["model.safetensors"])
	}
	add(nil)
	add(overflowHeads)
	add(hugeLayers)
	add(hugeTokenID)
	add(func(_ testing.TB, files map[string][]byte) { // a header length past the end
		st := append([]byte(nil), files["model.safetensors"]...)
		st[0], st[7] = 0xff, 0x7f
		files["model.safetensors"] = st
	})
	add(func(_ testing.TB, files map[string][]byte) { // a truncated header
		files["model.safetensors"] = files["model.safetensors"][:64]
	})
	f.Fuzz(func(t *testing.T, config, tokenizer, meta, weights []byte) {
		m, err := loadFiles(map[string][]byte{"config.json": config, "tokenizer.json": tokenizer, "chunlian.json": meta, "model.safetensors": weights})
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("LoadFS accepted a model that fails Validate: %v", err)
		}
		if m.Config.ParamCount() <= 0 {
			t.Fatal(fmt.Sprint("accepted a model with no parameters: ", m.Config))
		}
	})
}
