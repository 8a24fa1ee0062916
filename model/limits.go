package model

import (
	"fmt"
	"strings"
)

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
