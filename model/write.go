package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/nlpodyssey/safetensors"
)

// WriteDir saves m as a Hugging Face model directory (config.json,
// model.safetensors in F32, tokenizer.json, chunlian.json) that Load reads
// back bit-exactly. lm_head.weight is omitted when the embeddings are tied,
// as transformers does. dir is created if needed; existing files are
// overwritten.
func WriteDir(m *Model, dir string) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg, err := marshalConfig(m.Config, m.Special("bos"), m.Special("eos"), m.Special("pad"))
	if err != nil {
		return err
	}
	tok, err := json.Marshal(m.Tok)
	if err != nil {
		return err
	}
	meta, err := json.MarshalIndent(m.Meta, "", "  ")
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"config.json": cfg, "tokenizer.json": tok, "chunlian.json": meta} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}

	c, w := m.Config, m.Weights
	d, q, kv, ffn, v := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize, c.VocabSize
	tensors := map[string]safetensors.TensorView{}
	var terr error
	add := func(name string, x []float32, shape ...int) {
		buf := make([]byte, 4*len(x))
		for i, f := range x {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(f))
		}
		s := make([]uint64, len(shape))
		for i, n := range shape {
			s[i] = uint64(n)
		}
		tv, err := safetensors.NewTensorView(safetensors.F32, s, buf)
		if err != nil && terr == nil {
			terr = fmt.Errorf("tensor %s: %w", name, err)
		}
		tensors[name] = tv
	}
	add("model.embed_tokens.weight", w.Embed, v, d)
	for i, l := range w.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		add(p+"input_layernorm.weight", l.AttnNorm, d)
		add(p+"self_attn.q_proj.weight", l.Wq, q, d)
		add(p+"self_attn.k_proj.weight", l.Wk, kv, d)
		add(p+"self_attn.v_proj.weight", l.Wv, kv, d)
		add(p+"self_attn.o_proj.weight", l.Wo, d, q)
		add(p+"post_attention_layernorm.weight", l.MLPNorm, d)
		add(p+"mlp.gate_proj.weight", l.WGate, ffn, d)
		add(p+"mlp.up_proj.weight", l.WUp, ffn, d)
		add(p+"mlp.down_proj.weight", l.WDown, d, ffn)
	}
	add("model.norm.weight", w.FinalNorm, d)
	if !c.TieWordEmbeddings {
		add("lm_head.weight", w.LMHead, v, d)
	}
	if terr != nil {
		return terr
	}
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return err
	}
	if err := safetensors.SerializeToWriter(tensors, map[string]string{"format": "pt"}, f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
