package model

import (
	"encoding/binary"
	"errors"
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

// checkBF16Matches fails unless w.BF16 holds exactly the float32 matrices.
func checkBF16Matches(t *testing.T, w *Weights) {
	t.Helper()
	if w.BF16 == nil {
		t.Fatal("BF16 is nil")
	}
	same := func(name string, b []uint16, f []float32) {
		t.Helper()
		if len(b) != len(f) {
			t.Fatalf("%s: %d bf16 values, %d float32", name, len(b), len(f))
		}
		for i := range f {
			if g := math.Float32frombits(uint32(b[i]) << 16); g != f[i] {
				t.Fatalf("%s[%d]: bf16 %g, float32 %g", name, i, g, f[i])
			}
		}
	}
	same("lm_head", w.BF16.LMHead, w.LMHead)
	if len(w.BF16.Layers) != len(w.Layers) {
		t.Fatalf("%d bf16 layers, %d layers", len(w.BF16.Layers), len(w.Layers))
	}
	for i := range w.Layers {
		l, b := &w.Layers[i], &w.BF16.Layers[i]
		qkv, gu := l.Fused()
		same("qkv", b.QKV, qkv)
		same("gate_up", b.GateUp, gu)
		same("o_proj", b.Wo, l.Wo)
		same("down_proj", b.WDown, l.WDown)
	}
}

func TestBuildBF16(t *testing.T) {
	m := NewRandom(TestConfig(), 3)
	if m.Weights.BuildBF16() || m.Weights.BF16 != nil {
		t.Fatal("BuildBF16 accepted float32 random weights that are not bf16 values")
	}
	// Round: every matrix now holds bf16 values, within bf16's relative
	// precision (2^-8) of the originals.
	orig := append([]float32(nil), m.Weights.Layers[0].WDown...)
	m.Weights.RoundToBF16()
	checkBF16Matches(t, m.Weights)
	for i, f := range m.Weights.Layers[0].WDown {
		if d := math.Abs(float64(f - orig[i])); d > math.Abs(float64(orig[i]))/256 {
			t.Fatalf("WDown[%d]: rounded %g from %g", i, f, orig[i])
		}
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	// A file holding bf16-exact values loads with BF16 set; one value off
	// by one ulp of float32 makes it nil again.
	dir := t.TempDir()
	if err := WriteDir(m, dir); err != nil {
		t.Fatal(err)
	}
	m2, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkBF16Matches(t, m2.Weights)
	m.Weights.Layers[1].Wo[5] = math.Nextafter32(m.Weights.Layers[1].Wo[5], 1)
	if m.Weights.BuildBF16() {
		t.Fatal("BuildBF16 accepted a matrix with an inexact value")
	}
	// A broken BF16 shape is reported by Validate.
	m2.Weights.BF16.Layers[0].Wo = m2.Weights.BF16.Layers[0].Wo[1:]
	if err := m2.Validate(); err == nil {
		t.Fatal("Validate accepted a short bf16 o_proj")
	}
}

// TestDefaultHasBF16 checks that the shipped model (stored in bf16) loads
// with its bf16 copies.
func TestDefaultHasBF16(t *testing.T) {
	m, err := Default()
	if errors.Is(err, ErrNoDefault) {
		t.Skip("no default model embedded")
	}
	if err != nil {
		t.Fatal(err)
	}
	checkBF16Matches(t, m.Weights)
}

func TestBF16Round(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3f80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie → even
		{math.Float32frombits(0x3f818000), 0x3f82},
		{math.Float32frombits(0x3f807fff), 0x3f80},
		{-3, 0xc040},
	} {
		if got := bf16Round(c.f); got != c.want {
			t.Errorf("bf16Round(%g)=%#x, want %#x", c.f, got, c.want)
		}
	}
}
