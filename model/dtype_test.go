package model

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/nlpodyssey/safetensors"
)

// f16Trunc encodes a normal float32 as binary16 by truncating the mantissa
// and returns the bits and the exact value they hold (computed with
// math.Ldexp, independently of the loader's decoder).
func f16Trunc(f float32) (uint16, float32) {
	if f == 0 {
		return 0, 0
	}
	frac, exp := math.Frexp(float64(f)) // f = frac·2^exp, 0.5 ≤ |frac| < 1
	sign := uint16(0)
	if frac < 0 {
		sign, frac = 0x8000, -frac
	}
	e := exp - 1 + 15 // biased exponent of 1.m form
	if e <= 0 || e >= 31 {
		return sign, float32(math.Copysign(0, -float64(sign))) // flush tiny/huge to ±0 (test data is in range)
	}
	m := uint16((frac*2 - 1) * 1024) // 10 mantissa bits, truncated
	v := math.Ldexp(1+float64(m)/1024, e-15)
	if sign != 0 {
		v = -v
	}
	return sign | uint16(e)<<10 | m, float32(v)
}

// TestLoadHalfPrecision rewrites a saved random model in BF16 and in F16 and
// checks that Load converts every weight to the exact value the 16-bit
// pattern holds.
func TestLoadHalfPrecision(t *testing.T) {
	m := NewRandom(TestConfig(), 9)
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		t.Run(dt.String(), func(t *testing.T) {
			dir := t.TempDir()
			if err := WriteDir(m, dir); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, "model.safetensors")
			buf, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			st, err := safetensors.Deserialize(buf)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string][]float32{}
			views := map[string]safetensors.TensorView{}
			for _, nt := range st.Tensors() {
				src := nt.TensorView.Data()
				n := len(src) / 4
				out, exp := make([]byte, 2*n), make([]float32, n)
				for i := 0; i < n; i++ {
					f := math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
					var bits uint16
					if dt == safetensors.BF16 {
						bits = uint16(math.Float32bits(f) >> 16)
						exp[i] = math.Float32frombits(uint32(bits) << 16)
					} else {
						bits, exp[i] = f16Trunc(f)
					}
					binary.LittleEndian.PutUint16(out[2*i:], bits)
				}
				tv, err := safetensors.NewTensorView(dt, nt.TensorView.Shape(), out)
				if err != nil {
					t.Fatal(err)
				}
				views[nt.Name], want[nt.Name] = tv, exp
			}
			b, err := safetensors.Serialize(views, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			for name, g := range map[string][]float32{
				"model.embed_tokens.weight":              got.Weights.Embed,
				"lm_head.weight":                         got.Weights.LMHead,
				"model.norm.weight":                      got.Weights.FinalNorm,
				"model.layers.1.self_attn.k_proj.weight": got.Weights.Layers[1].Wk,
				"model.layers.0.mlp.down_proj.weight":    got.Weights.Layers[0].WDown,
			} {
				w := want[name]
				if len(g) != len(w) {
					t.Fatalf("%s: %d values, want %d", name, len(g), len(w))
				}
				for i := range w {
					if g[i] != w[i] {
						t.Fatalf("%s[%d] = %g, want %g", name, i, g[i], w[i])
					}
				}
			}
		})
	}
}
