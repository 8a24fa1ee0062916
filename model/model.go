// Package model holds a loaded couplet model: its Hugging Face config, its
// weights as host float32 tensors, its tokenizer and the chunlian.json prompt
// contract. It knows nothing about batching or caches; see package forward for
// the forward pass and package engine for scheduling.
package model

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"chunlian/weights"
)

// Config mirrors the fields of a Hugging Face LlamaForCausalLM config.json
// that the forward pass needs.
type Config struct {
	VocabSize         int     `json:"vocab_size"`
	HiddenSize        int     `json:"hidden_size"`
	IntermediateSize  int     `json:"intermediate_size"`
	NumLayers         int     `json:"num_hidden_layers"`
	NumHeads          int     `json:"num_attention_heads"`
	NumKVHeads        int     `json:"num_key_value_heads"`
	HeadDim           int     `json:"head_dim"` // 0 in the file means HiddenSize/NumHeads
	RMSNormEps        float64 `json:"rms_norm_eps"`
	RopeTheta         float64 `json:"rope_theta"` // also read from rope_parameters.rope_theta (transformers ≥ 5)
	MaxPositions      int     `json:"max_position_embeddings"`
	TieWordEmbeddings bool    `json:"tie_word_embeddings"`
}

// Layer holds one decoder layer's weights. Matrices are row-major in the
// Hugging Face [out_features, in_features] layout, so a projection is
// y = x · Wᵀ (see kernels/cpu.Gemm).
type Layer struct {
	AttnNorm []float32 // [d]
	Wq       []float32 // [nHeads*headDim, d]
	Wk       []float32 // [nKVHeads*headDim, d]
	Wv       []float32 // [nKVHeads*headDim, d]
	Wo       []float32 // [d, nHeads*headDim]
	MLPNorm  []float32 // [d]
	WGate    []float32 // [ffn, d]
	WUp      []float32 // [ffn, d]
	WDown    []float32 // [d, ffn]
}

// Weights are the whole model's parameters in float32 (converted from the
// file's bf16/fp16/fp32 at load time).
type Weights struct {
	Embed     []float32 // [vocab, d]
	Layers    []Layer
	FinalNorm []float32 // [d]
	LMHead    []float32 // [vocab, d]; the same slice as Embed when tied
	// BF16 holds bf16 copies of the matrices when they are all exactly
	// bf16 values (the file stored bf16; see BuildBF16), else nil.
	BF16 *BF16Weights
}

// Default loads the model embedded in the binary (package chunlian/weights,
// directory weights.DefaultDir). The model is immutable, so it is loaded and
// converted to float32 once per process and shared by every caller.
func Default() (*Model, error) {
	return loadDefault()
}

var loadDefault = sync.OnceValues(loadDefaultUncached)

func loadDefaultUncached() (*Model, error) { return LoadFS(weights.FS, weights.DefaultDir) }

// DefaultSpring loads the embedded spring model (weights.SpringDir): the
// default model fine-tuned on spring-festival couplets, for the
// blessing-word modes. It shares Default's tokenizer and prompt contract.
// Loaded once per process, like Default.
func DefaultSpring() (*Model, error) {
	return loadSpring()
}

var loadSpring = sync.OnceValues(func() (*Model, error) { return LoadFS(weights.SpringFS, weights.SpringDir) })

// Compatible reports why o cannot serve requests built for m (nil if it
// can): both must share the tokenizer's ids and the chunlian.json prompt
// contract, so that one prompt and one set of logits processors fit both.
func (m *Model) Compatible(o *Model) error {
	if !slices.Equal(m.Tok.tokens, o.Tok.tokens) || !slices.Equal(m.Tok.special, o.Tok.special) {
		return fmt.Errorf("model %s: its tokenizer differs from model %s's", o.Name, m.Name)
	}
	if !reflect.DeepEqual(m.Meta, o.Meta) {
		return fmt.Errorf("model %s: its chunlian.json differs from model %s's", o.Name, m.Name)
	}
	if m.Config.VocabSize != o.Config.VocabSize {
		return fmt.Errorf("model %s: vocab_size %d, model %s has %d", o.Name, o.Config.VocabSize, m.Name, m.Config.VocabSize)
	}
	return nil
}

// ErrNoDefault is returned by Default when the binary embeds no model. The
// current build embeds one, so it is only kept for callers that test for it.
var ErrNoDefault = errors.New("model: default model not built yet (weights/chunlian-base missing); use --model DIR")
