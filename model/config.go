package model

import (
	"encoding/json"
	"fmt"
	"strings"
)

// rawConfig is config.json as written by transformers (4.x or 5.x). Fields
// that the forward pass does not implement are read only so that a model
// needing them is rejected instead of silently computed wrong.
type rawConfig struct {
	Config
	Architectures  []string        `json:"architectures"`
	ModelType      string          `json:"model_type"`
	HiddenAct      string          `json:"hidden_act"`
	AttentionBias  bool            `json:"attention_bias"`
	MLPBias        bool            `json:"mlp_bias"`
	RopeScaling    json.RawMessage `json:"rope_scaling"`
	RopeParameters json.RawMessage `json:"rope_parameters"`
}

// ropeParameters is transformers ≥ 5's home for rope_theta and the RoPE
// variant.
type ropeParameters struct {
	RopeTheta float64 `json:"rope_theta"`
	RopeType  string  `json:"rope_type"`
}

// ParseConfig reads a Hugging Face LlamaForCausalLM config.json, fills in the
// defaults transformers uses (head_dim = hidden/heads, KV heads = heads,
// rope_theta 10000, rms_norm_eps 1e-6) and rejects settings the forward pass
// does not implement (RoPE scaling, attention/MLP biases, other activations).
func ParseConfig(data []byte) (Config, error) {
	var rc rawConfig
	if err := json.Unmarshal(data, &rc); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	if len(rc.Architectures) > 0 && !contains(rc.Architectures, "LlamaForCausalLM") {
		return Config{}, fmt.Errorf("config.json: architectures %v: only LlamaForCausalLM is supported", rc.Architectures)
	}
	if rc.ModelType != "" && rc.ModelType != "llama" {
		return Config{}, fmt.Errorf("config.json: model_type %q: only \"llama\" is supported", rc.ModelType)
	}
	if rc.HiddenAct != "" && rc.HiddenAct != "silu" {
		return Config{}, fmt.Errorf("config.json: hidden_act %q: only \"silu\" is supported", rc.HiddenAct)
	}
	if rc.AttentionBias {
		return Config{}, fmt.Errorf("config.json: attention_bias=true is not supported")
	}
	if rc.MLPBias {
		return Config{}, fmt.Errorf("config.json: mlp_bias=true is not supported")
	}
	if s := strings.TrimSpace(string(rc.RopeScaling)); s != "" && s != "null" {
		return Config{}, fmt.Errorf("config.json: rope_scaling %s is not supported", s)
	}
	c := rc.Config
	if s := strings.TrimSpace(string(rc.RopeParameters)); s != "" && s != "null" {
		var rp ropeParameters
		if err := json.Unmarshal(rc.RopeParameters, &rp); err != nil {
			return Config{}, fmt.Errorf("config.json: rope_parameters: %w", err)
		}
		if rp.RopeType != "" && rp.RopeType != "default" {
			return Config{}, fmt.Errorf("config.json: rope_parameters.rope_type %q is not supported (only \"default\")", rp.RopeType)
		}
		if c.RopeTheta == 0 {
			c.RopeTheta = rp.RopeTheta
		}
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if c.NumKVHeads == 0 {
		c.NumKVHeads = c.NumHeads
	}
	if c.HeadDim == 0 && c.NumHeads > 0 && c.NumHeads <= MaxHeads {
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	return c, nil
}

// Validate checks that the dimensions are within the bounds below
// and consistent. It expects the defaults already filled in (HeadDim, NumKVHeads set).
func (c Config) Validate() error {
	if err := c.checkBounds(); err != nil {
		return err
	}
	if c.NumHeads%c.NumKVHeads != 0 {
		return fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.NumHeads, c.NumKVHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("head_dim %d must be even for RoPE", c.HeadDim)
	}
	if c.RMSNormEps <= 0 || c.RopeTheta <= 0 {
		return fmt.Errorf("rms_norm_eps (%g) and rope_theta (%g) must be positive", c.RMSNormEps, c.RopeTheta)
	}
	return nil
}

// QDim is the width of the query projection (nHeads·headDim).
func (c Config) QDim() int { return c.NumHeads * c.HeadDim }

// KVDim is the width of the key and value projections (nKVHeads·headDim).
func (c Config) KVDim() int { return c.NumKVHeads * c.HeadDim }

// marshalConfig writes c as a transformers-compatible config.json.
func marshalConfig(c Config, bosID, eosID, padID int32) ([]byte, error) {
	out := map[string]any{
		"architectures":           []string{"LlamaForCausalLM"},
		"model_type":              "llama",
		"hidden_act":              "silu",
		"attention_bias":          false,
		"mlp_bias":                false,
		"vocab_size":              c.VocabSize,
		"hidden_size":             c.HiddenSize,
		"intermediate_size":       c.IntermediateSize,
		"num_hidden_layers":       c.NumLayers,
		"num_attention_heads":     c.NumHeads,
		"num_key_value_heads":     c.NumKVHeads,
		"head_dim":                c.HeadDim,
		"rms_norm_eps":            c.RMSNormEps,
		"rope_theta":              c.RopeTheta,
		"rope_scaling":            nil,
		"max_position_embeddings": c.MaxPositions,
		"tie_word_embeddings":     c.TieWordEmbeddings,
		"torch_dtype":             "float32",
	}
	if bosID >= 0 {
		out["bos_token_id"] = bosID
	}
	if eosID >= 0 {
		out["eos_token_id"] = eosID
	}
	if padID >= 0 {
		out["pad_token_id"] = padID
	}
	return json.MarshalIndent(out, "", "  ")
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// Bounds on every size a model directory declares. They are far above any
// couplet model (the shipped one has d=384, 6 layers, 7k ids) and far below
// what would overflow an int or ask for an absurd allocation: a model
// directory is untrusted input (--model), so every size is checked against
// them before anything is allocated from it.
const (
	MaxVocabSize        = 1 << 20 // ids in config.json and tokenizer.json
	MaxHiddenSize       = 1 << 14
	MaxIntermediateSize = 1 << 16
	MaxLayers           = 256
	MaxHeads            = 256
	MaxHeadDim          = 1024
	MaxPositions        = 1 << 20
	MaxLineLengthLimit  = 256 // chunlian.json max_line_length
)

// checkBounds reports the first config field outside its bound. It runs
// before any derived product (QDim, KVDim, tensor sizes) is computed, so
// those products cannot overflow.
func (c Config) checkBounds() error {
	for _, f := range []struct {
		name string
		v    int
		max  int
	}{
		{"vocab_size", c.VocabSize, MaxVocabSize}, {"hidden_size", c.HiddenSize, MaxHiddenSize},
		{"intermediate_size", c.IntermediateSize, MaxIntermediateSize}, {"num_hidden_layers", c.NumLayers, MaxLayers},
		{"num_attention_heads", c.NumHeads, MaxHeads}, {"num_key_value_heads", c.NumKVHeads, MaxHeads},
		{"head_dim", c.HeadDim, MaxHeadDim},
	} {
		if f.v <= 0 || f.v > f.max {
			return fmt.Errorf("%s %d: must be between 1 and %d", f.name, f.v, f.max)
		}
	}
	if c.MaxPositions < 0 || c.MaxPositions > MaxPositions {
		return fmt.Errorf("max_position_embeddings %d: must be between 0 and %d", c.MaxPositions, MaxPositions)
	}
	return nil
}

// ParamCount is the number of parameters the config describes (lm_head
// counted once more unless tied). Call only on a validated config.
func (c Config) ParamCount() int64 {
	d, q, kv, ffn, v := int64(c.HiddenSize), int64(c.QDim()), int64(c.KVDim()), int64(c.IntermediateSize), int64(c.VocabSize)
	perLayer := 2*d + q*d + 2*kv*d + d*q + 3*ffn*d
	n := v*d + int64(c.NumLayers)*perLayer + d
	if !c.TieWordEmbeddings {
		n += v * d
	}
	return n
}

// validateMeta checks chunlian.json on its own (bounds and the length token
// pattern) before it is used to look anything up.
func (m Meta) validate() error {
	if m.MaxLineLength < 1 || m.MaxLineLength > MaxLineLengthLimit {
		return fmt.Errorf("chunlian.json: max_line_length %d: must be between 1 and %d", m.MaxLineLength, MaxLineLengthLimit)
	}
	if strings.Count(m.LengthToken, "%d") != 1 || strings.Count(m.LengthToken, "%") != 1 {
		return fmt.Errorf("chunlian.json: length_token %q needs exactly one %%d and no other %% verb", m.LengthToken)
	}
	return nil
}
