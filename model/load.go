package model

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/nlpodyssey/safetensors"
)

// Model is a loaded couplet model. It is immutable after Load/NewRandom and
// may be shared by any number of goroutines and backends.
type Model struct {
	Config  Config
	Weights *Weights
	Tok     *Tokenizer
	Meta    Meta
	Name    string // the directory's base name, e.g. "chunlian-base"
}

// Roles that chunlian.json must define (see Meta).
var Roles = []string{"pad", "unk", "bos", "eos", "keyword", "acrostic", "lower", "up", "sep", "banner"}

// Special returns the id of the special token with the given role (see
// Meta.SpecialTokens), or -1 if the role or its token is unknown.
func (m *Model) Special(role string) int32 {
	text, ok := m.Meta.SpecialTokens[role]
	if !ok {
		return -1
	}
	id, ok := m.Tok.ID(text)
	if !ok {
		return -1
	}
	return id
}

// LengthToken returns the id of the length token for a line of n
// characters; false when n is outside 1..MaxLineLength.
func (m *Model) LengthToken(n int) (int32, bool) {
	if n < 1 || n > m.Meta.MaxLineLength || m.Meta.LengthToken == "" {
		return -1, false
	}
	return m.Tok.ID(fmt.Sprintf(m.Meta.LengthToken, n))
}

// Validate checks the whole model: the config, every weight's length
// against it, the tokenizer against vocab_size, and that chunlian.json's
// special tokens and length tokens exist in the vocabulary. All problems are
// reported together.
func (m *Model) Validate() error {
	var errs []error
	if err := m.Config.Validate(); err != nil {
		return fmt.Errorf("model %s: config: %w", m.Name, err)
	}
	c := m.Config
	d, q, kv, ffn, v := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize, c.VocabSize
	check := func(name string, got []float32, rows, cols int) {
		if len(got) != rows*cols {
			errs = append(errs, fmt.Errorf("%s: %d values, want [%d,%d]", name, len(got), rows, cols))
		}
	}
	w := m.Weights
	if w == nil {
		errs = append(errs, errors.New("no weights"))
	} else {
		check("embed", w.Embed, v, d)
		check("final norm", w.FinalNorm, 1, d)
		check("lm_head", w.LMHead, v, d)
		if len(w.Layers) != c.NumLayers {
			errs = append(errs, fmt.Errorf("%d layers, config says %d", len(w.Layers), c.NumLayers))
		}
		for i, l := range w.Layers {
			p := fmt.Sprintf("layer %d ", i)
			check(p+"input_layernorm", l.AttnNorm, 1, d)
			check(p+"q_proj", l.Wq, q, d)
			check(p+"k_proj", l.Wk, kv, d)
			check(p+"v_proj", l.Wv, kv, d)
			check(p+"o_proj", l.Wo, d, q)
			check(p+"post_attention_layernorm", l.MLPNorm, 1, d)
			check(p+"gate_proj", l.WGate, ffn, d)
			check(p+"up_proj", l.WUp, ffn, d)
			check(p+"down_proj", l.WDown, d, ffn)
		}
		if b := w.BF16; b != nil {
			check16 := func(name string, got []uint16, rows, cols int) {
				if len(got) != rows*cols {
					errs = append(errs, fmt.Errorf("bf16 %s: %d values, want [%d,%d]", name, len(got), rows, cols))
				}
			}
			check16("lm_head", b.LMHead, v, d)
			if len(b.Layers) != len(w.Layers) {
				errs = append(errs, fmt.Errorf("bf16: %d layers, want %d", len(b.Layers), len(w.Layers)))
			}
			for i, l := range b.Layers {
				p := fmt.Sprintf("layer %d ", i)
				check16(p+"qkv", l.QKV, q+2*kv, d)
				check16(p+"gate_up", l.GateUp, 2*ffn, d)
				check16(p+"o_proj", l.Wo, d, q)
				check16(p+"down_proj", l.WDown, d, ffn)
			}
		}
	}
	if err := m.validateVocab(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("model %s: %w", m.Name, err)
	}
	return nil
}

// validateVocab checks the tokenizer against vocab_size and that
// chunlian.json's special tokens and length tokens exist in it.
func (m *Model) validateVocab() error {
	if m.Tok == nil {
		return errors.New("no tokenizer")
	}
	var errs []error
	if m.Tok.Size() > m.Config.VocabSize {
		errs = append(errs, fmt.Errorf("tokenizer has %d ids, vocab_size is %d", m.Tok.Size(), m.Config.VocabSize))
	}
	for _, role := range Roles {
		text, ok := m.Meta.SpecialTokens[role]
		if !ok {
			errs = append(errs, fmt.Errorf("chunlian.json: special token role %q missing", role))
			continue
		}
		if _, ok := m.Tok.ID(text); !ok {
			errs = append(errs, fmt.Errorf("chunlian.json: special token %s=%q not in the vocabulary", role, text))
		}
	}
	if err := m.Meta.validate(); err != nil {
		errs = append(errs, err)
	} else {
		for n := 1; n <= m.Meta.MaxLineLength; n++ {
			if _, ok := m.LengthToken(n); !ok {
				errs = append(errs, fmt.Errorf("chunlian.json: length token %q not in the vocabulary", fmt.Sprintf(m.Meta.LengthToken, n)))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// Load reads a Hugging Face model directory from disk (config.json,
// model.safetensors, tokenizer.json, chunlian.json).
func Load(dir string) (*Model, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	m, err := LoadFS(diskFS{FS: os.DirFS(abs), root: abs}, ".")
	if err != nil {
		return nil, err
	}
	m.Name = filepath.Base(abs)
	return m, nil
}

// LoadFS reads a model directory from fsys (e.g. the embedded weights.FS).
// Weights are converted to float32 (F32, F16 and BF16 files are accepted).
// The directory is untrusted: every size in config.json, tokenizer.json and
// chunlian.json is checked against bounds (config.go) and against each
// other, and the config's parameter count against the weights file's size,
// before anything is allocated from them; errors name the file and field.
func LoadFS(fsys fs.FS, dir string) (*Model, error) {
	read := func(name string) ([]byte, error) {
		b, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("model dir %s: %w", dir, err)
		}
		return b, nil
	}
	m := &Model{Name: path.Base(dir)}
	if err := m.loadSmallFiles(read); err != nil {
		return nil, err
	}
	// The weights file is memory-mapped when it is on disk (Load): it is
	// only read once, to convert to float32, so mapping avoids a transient
	// heap copy of the whole file. parseWeights keeps no reference to it.
	var b []byte
	var err error
	release := func() error { return nil }
	if dfs, ok := fsys.(diskFS); ok {
		b, release, err = mapFile(filepath.Join(dfs.root, filepath.FromSlash(path.Join(dir, "model.safetensors"))))
		if err != nil {
			return nil, fmt.Errorf("model dir %s: %w", dfs.root, err)
		}
	} else if b, err = read("model.safetensors"); err != nil {
		return nil, err
	}
	// Every supported dtype takes at least 2 bytes a value.
	if need := m.Config.ParamCount(); need > int64(len(b))/2 {
		err = fmt.Errorf("config.json describes %d parameters (at least %d bytes) but the file has %d bytes", need, 2*need, len(b))
	} else {
		m.Weights, err = parseWeights(b, m.Config)
	}
	if rerr := release(); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return nil, fmt.Errorf("model.safetensors: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// loadSmallFiles reads and cross-checks config.json, tokenizer.json and
// chunlian.json: the tokenizer's id space must fit vocab_size and
// chunlian.json's tokens must exist, all before the weights are read.
func (m *Model) loadSmallFiles(read func(string) ([]byte, error)) error {
	b, err := read("config.json")
	if err != nil {
		return err
	}
	if m.Config, err = ParseConfig(b); err != nil {
		return err
	}
	if b, err = read("tokenizer.json"); err != nil {
		return err
	}
	if m.Tok, err = ParseTokenizer(b); err != nil {
		return err
	}
	if m.Tok.Size() > m.Config.VocabSize {
		return fmt.Errorf("tokenizer.json: largest id %d does not fit config.json vocab_size %d", m.Tok.Size()-1, m.Config.VocabSize)
	}
	if b, err = read("chunlian.json"); err != nil {
		return err
	}
	if err = json.Unmarshal(b, &m.Meta); err != nil {
		return fmt.Errorf("chunlian.json: %w", err)
	}
	if err := m.Meta.validate(); err != nil {
		return err
	}
	return m.validateVocab()
}

// diskFS is the fs.FS Load uses: a directory on disk, whose root path lets
// LoadFS memory-map the weights file.
type diskFS struct {
	fs.FS
	root string
}

// parseWeights converts the safetensors file's tensors to float32, checking
// every name and shape against the config. Tensors other than the Llama ones
// are rejected (a bias tensor would mean the model computes something we do
// not), except rotary_emb.inv_freq buffers, which some exporters keep.
func parseWeights(buf []byte, c Config) (*Weights, error) {
	st, err := safetensors.Deserialize(buf)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	var errs []error
	get := func(name string, shape ...int) []float32 {
		used[name] = true
		tv, ok := st.Tensor(name)
		if !ok {
			errs = append(errs, fmt.Errorf("tensor %s missing", name))
			return nil
		}
		got := tv.Shape()
		same := len(got) == len(shape)
		for i := 0; same && i < len(shape); i++ {
			same = got[i] == uint64(shape[i])
		}
		if !same {
			errs = append(errs, fmt.Errorf("tensor %s has shape %v, want %v", name, got, shape))
			return nil
		}
		out, err := toFloat32(tv.DType(), tv.Data())
		if err != nil {
			errs = append(errs, fmt.Errorf("tensor %s: %w", name, err))
		}
		return out
	}
	d, q, kv, ffn, v := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize, c.VocabSize
	w := &Weights{Embed: get("model.embed_tokens.weight", v, d)}
	for i := 0; i < c.NumLayers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		w.Layers = append(w.Layers, Layer{
			AttnNorm: get(p+"input_layernorm.weight", d),
			Wq:       get(p+"self_attn.q_proj.weight", q, d),
			Wk:       get(p+"self_attn.k_proj.weight", kv, d),
			Wv:       get(p+"self_attn.v_proj.weight", kv, d),
			Wo:       get(p+"self_attn.o_proj.weight", d, q),
			MLPNorm:  get(p+"post_attention_layernorm.weight", d),
			WGate:    get(p+"mlp.gate_proj.weight", ffn, d),
			WUp:      get(p+"mlp.up_proj.weight", ffn, d),
			WDown:    get(p+"mlp.down_proj.weight", d, ffn),
		})
	}
	w.FinalNorm = get("model.norm.weight", d)
	_, hasHead := st.Tensor("lm_head.weight")
	switch {
	case c.TieWordEmbeddings:
		// transformers ties lm_head to the embeddings whatever the file
		// holds; a differing lm_head means the config is wrong.
		w.LMHead = w.Embed
		if hasHead {
			if h := get("lm_head.weight", v, d); h != nil && w.Embed != nil && !equalF32(h, w.Embed) {
				errs = append(errs, errors.New("tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight"))
			}
		}
	case hasHead:
		w.LMHead = get("lm_head.weight", v, d)
	default:
		errs = append(errs, errors.New("tensor lm_head.weight missing and tie_word_embeddings is false"))
	}
	for _, name := range st.Names() {
		if !used[name] && !strings.HasSuffix(name, "rotary_emb.inv_freq") {
			errs = append(errs, fmt.Errorf("unexpected tensor %s (biases and other architectures are not supported)", name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	packLayers(w)
	w.BuildBF16() // bf16 files: keep bf16 copies for memory-bound small-batch GEMMs
	return w, nil
}

// toFloat32 converts little-endian F32/F16/BF16 data to a fresh []float32.
// On little-endian machines with aligned data (the usual case: safetensors
// pads its header to 8 bytes and offsets are multiples of the element size)
// the source is read in place as []uint16/[]uint32, which is several times
// faster than decoding byte by byte; loading the shipped model is dominated
// by this loop.
func toFloat32(dt safetensors.DType, data []byte) ([]float32, error) {
	switch dt {
	case safetensors.F32:
		out := make([]float32, len(data)/4)
		if src, ok := asUint32(data); ok {
			for i, u := range src {
				out[i] = math.Float32frombits(u)
			}
			return out, nil
		}
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		return out, nil
	case safetensors.BF16:
		out := make([]float32, len(data)/2)
		if src, ok := asUint16(data); ok {
			for i, u := range src {
				out[i] = math.Float32frombits(uint32(u) << 16)
			}
			return out, nil
		}
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(data[2*i:])) << 16)
		}
		return out, nil
	case safetensors.F16:
		out := make([]float32, len(data)/2)
		for i := range out {
			out[i] = halfToFloat32(binary.LittleEndian.Uint16(data[2*i:]))
		}
		return out, nil
	}
	return nil, fmt.Errorf("dtype %s not supported (want F32, F16 or BF16)", dt)
}

// littleEndian reports whether the machine stores integers little-endian,
// i.e. whether file bytes can be reinterpreted in place.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// asUint16 views data as []uint16 without copying when that reads the same
// values as little-endian decoding (LE machine, 2-byte aligned).
func asUint16(data []byte) ([]uint16, bool) {
	if !littleEndian || len(data) < 2 || uintptr(unsafe.Pointer(&data[0]))%2 != 0 {
		return nil, false
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&data[0])), len(data)/2), true
}

// asUint32 is asUint16 for 4-byte values.
func asUint32(data []byte) ([]uint32, bool) {
	if !littleEndian || len(data) < 4 || uintptr(unsafe.Pointer(&data[0]))%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&data[0])), len(data)/4), true
}

// halfToFloat32 converts an IEEE 754 binary16 value exactly.
func halfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf/NaN
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: mant · 2^-24
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// packLayers re-lays each layer's Wq, Wk, Wv into one contiguous array
// [nHeads·hd + 2·nKVHeads·hd, d] and WGate, WUp into one [2·ffn, d], keeping
// the separate fields as views into them (uncapped, so the first view's
// capacity reaches the whole group; weights are never appended to). The matrices are row-major
// [out, in], so stacking along out is plain concatenation, and a backend can
// run one fused GEMM per group (fewer, larger calls: better for small
// batches) without a second copy of the weights; see Fused.
func packLayers(w *Weights) {
	for i := range w.Layers {
		l := &w.Layers[i]
		if qkv := concat(l.Wq, l.Wk, l.Wv); qkv != nil {
			nq, nk := len(l.Wq), len(l.Wk)
			l.Wq, l.Wk, l.Wv = qkv[:nq], qkv[nq:nq+nk], qkv[nq+nk:]
		}
		if gu := concat(l.WGate, l.WUp); gu != nil {
			ng := len(l.WGate)
			l.WGate, l.WUp = gu[:ng], gu[ng:]
		}
	}
}

func concat(parts ...[]float32) []float32 {
	n := 0
	for _, p := range parts {
		if p == nil {
			return nil
		}
		n += len(p)
	}
	out := make([]float32, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Fused returns the layer's stacked QKV [q+2kv, d] and gate/up [2ffn, d]
// matrices: views when the layer was packed at load time (Load, LoadFS and
// NewRandom do this), fresh copies otherwise. The views are read-only like
// all weights.
func (l *Layer) Fused() (qkv, gateUp []float32) {
	if qkv = adjacent(l.Wq, l.Wk, l.Wv); qkv == nil {
		qkv = concat(l.Wq, l.Wk, l.Wv)
	}
	if gateUp = adjacent(l.WGate, l.WUp); gateUp == nil {
		gateUp = concat(l.WGate, l.WUp)
	}
	return qkv, gateUp
}

// adjacent returns parts as one slice when they are consecutive views of
// one backing array (each starts where the previous ends, and the first
// one's capacity covers them all), else nil.
func adjacent(parts ...[]float32) []float32 {
	n := 0
	for _, p := range parts {
		if len(p) == 0 {
			return nil
		}
		n += len(p)
	}
	first := parts[0]
	if cap(first) < n {
		return nil
	}
	all := first[:n]
	off := 0
	for _, p := range parts {
		if &all[off] != &p[0] {
			return nil
		}
		off += len(p)
	}
	return all
}
