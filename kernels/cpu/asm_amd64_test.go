//go:build amd64

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// siluTol is the largest relative difference allowed between siluMulAsm
// and siluMulGo where the result is not tiny: both compute g/(1+e)·up and
// differ only in e = exp(−g) (vector exp: FMA, n rounded to even; expf:
// no FMA, n rounded half away), each ~1e-7 relative, damped by e/(1+e).
// Measured maximum: see TestSiLUMulAsmMaxError's log (~2.4e-7).
const siluTol = 4e-7

// siluClose reports whether got (asm) matches want (Go): the same NaN-ness,
// the same infinity, equal zeros including the sign, else within siluTol,
// or both below 1e-30 in magnitude (g < −88.7: the two exps overflow at
// slightly different points there, giving −0 or ~−1e-37).
func siluClose(got, want float32) bool {
	g, w := float64(got), float64(want)
	switch {
	case math.IsNaN(w) || math.IsNaN(g):
		return math.IsNaN(w) && math.IsNaN(g)
	case math.IsInf(w, 0) || math.IsInf(g, 0):
		return g == w
	case w == 0 && g == 0:
		return math.Signbit(g) == math.Signbit(w)
	case math.Abs(w) < 1e-30 && math.Abs(g) < 1e-30:
		return true
	}
	return math.Abs(g-w) <= siluTol*math.Abs(w)
}

// TestSiLUMulAsm compares the assembly SiLU·mul with siluMulGo: edge values
// at every position of short rows (body, 16- and 8-float blocks, Go tail),
// random rows of every length 0..100, in place (out aliasing gate) and
// into a separate buffer whose entries past len(out) must stay untouched.
//
// Special values (both paths, checked here): g = NaN or up = NaN gives NaN;
// g = +Inf gives +Inf·up (NaN for up = 0); g = −Inf gives NaN (−Inf/Inf, as
// in siluMulGo); g ≤ −88.8 gives −0·up (e^−g = +Inf); g ≥ 87.4 gives
// exactly g·up; ±0 gives ±0·up.
func TestSiLUMulAsm(t *testing.T) {
	if !asmAVX2 {
		t.Skip("no AVX2+FMA")
	}
	edges := []struct{ g, up float32 }{
		{0, 3}, {float32(math.Copysign(0, -1)), 3}, {0, posInf},
		{1, 1}, {-1, 1}, {0.5, -2}, {1e-30, 1}, {-1e-30, 1},
		{20, 1}, {-20, 1}, {40, 1}, {-40, 1},
		{86.9, 1}, {-86.9, 1}, {87.4, 1}, {-87.4, 1}, {88.7, 1}, {-88.7, 1},
		{88.8, 1}, {-88.8, 1}, {89, 1}, {-89, 1}, {100, 1}, {-100, 1},
		{1e30, 2}, {-1e30, 2}, {math.MaxFloat32, 1}, {-math.MaxFloat32, 1},
		{posInf, 1}, {posInf, -1}, {posInf, 0}, {negInf, 1}, {negInf, 0},
		{nan32, 1}, {1, nan32}, {nan32, 0}, {2, posInf}, {-2, negInf},
	}
	check := func(t *testing.T, gate, up []float32) {
		t.Helper()
		n := len(gate)
		want := make([]float32, n)
		siluMulGo(want, gate, up)

		const sentinel = 12345
		out := make([]float32, n+9)
		for i := range out {
			out[i] = sentinel
		}
		siluMulAsm(out[:n], gate, up)
		for i := range n {
			if !siluClose(out[i], want[i]) {
				t.Fatalf("n=%d: silu(%v)·%v = %v, siluMulGo %v", n, gate[i], up[i], out[i], want[i])
			}
		}
		for i := n; i < len(out); i++ {
			if out[i] != sentinel {
				t.Fatalf("n=%d: out[%d] written past the end", n, i)
			}
		}

		inPlace := append([]float32(nil), gate...)
		siluMulAsm(inPlace, inPlace, up) // the forward pass's call
		for i := range n {
			if math.Float32bits(inPlace[i]) != math.Float32bits(out[i]) &&
				!(math.IsNaN(float64(inPlace[i])) && math.IsNaN(float64(out[i]))) {
				t.Fatalf("n=%d: in place [%d] = %v, out of place %v", n, i, inPlace[i], out[i])
			}
		}
	}

	r := rand.New(rand.NewPCG(3, 4))
	for _, e := range edges {
		t.Run(fmt.Sprintf("edge/g=%v/up=%v", e.g, e.up), func(t *testing.T) {
			for _, n := range []int{1, 7, 8, 15, 16, 17, 24, 33} {
				for pos := range n {
					gate, up := randSlice(r, n), randSlice(r, n)
					gate[pos], up[pos] = e.g, e.up
					check(t, gate, up)
				}
			}
		})
	}
	for _, scale := range []float32{1, 8, 40} {
		t.Run(fmt.Sprintf("random/scale=%v", scale), func(t *testing.T) {
			for n := 0; n <= 100; n++ {
				gate, up := randSlice(r, n), randSlice(r, n)
				for i := range gate {
					gate[i] *= scale
				}
				check(t, gate, up)
			}
		})
	}
}

// TestSiLUMulAsmMaxError sweeps g over [−90, 90] in steps of 1/1024 (up = 1)
// and logs the largest relative difference to siluMulGo and to float64
// silu; it fails above siluTol (vs Go) or 5e-7 (vs float64).
func TestSiLUMulAsmMaxError(t *testing.T) {
	if !asmAVX2 {
		t.Skip("no AVX2+FMA")
	}
	var gate []float32
	for v := -90.0; v <= 90; v += 1.0 / 1024 {
		gate = append(gate, float32(v))
	}
	up := make([]float32, len(gate))
	for i := range up {
		up[i] = 1
	}
	got, want := make([]float32, len(gate)), make([]float32, len(gate))
	siluMulAsm(got, gate, up)
	siluMulGo(want, gate, up)
	var vsGo, vsF64 float64
	var atGo, atF64 float32
	for i, g := range gate {
		if !siluClose(got[i], want[i]) {
			t.Fatalf("silu(%v) = %v, siluMulGo %v", g, got[i], want[i])
		}
		w := float64(g) / (1 + math.Exp(-float64(g)))
		if math.Abs(w) < 1e-30 {
			continue
		}
		if d := math.Abs(float64(got[i])-float64(want[i])) / math.Abs(float64(want[i])); d > vsGo {
			vsGo, atGo = d, g
		}
		if d := math.Abs(float64(got[i])-w) / math.Abs(w); d > vsF64 {
			vsF64, atF64 = d, g
		}
	}
	t.Logf("max relative difference: vs siluMulGo %.3g (g=%v), vs float64 %.3g (g=%v)", vsGo, atGo, vsF64, atF64)
	if vsF64 > 5e-7 {
		t.Errorf("max relative error vs float64 %.3g at g=%v, want ≤ 5e-7", vsF64, atF64)
	}
}

// TestPermuteXAsm: permuteX with the assembly chunks equals the scalar
// loop exactly (a permutation; NaN payloads and zero signs included) for
// every k in 0..100 and 384/1024 and 1..3 rows, and leaves nothing of
// xs's old contents in the padding.
func TestPermuteXAsm(t *testing.T) {
	if !permuteAsm {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(5, 6))
	ks := []int{384, 1024}
	for k := 0; k <= 100; k++ {
		ks = append(ks, k)
	}
	for _, k := range ks {
		for m := 1; m <= 3; m++ {
			x := randSlice(r, m*k)
			if len(x) > 0 {
				x[r.IntN(len(x))] = nan32
				x[r.IntN(len(x))] = float32(math.Copysign(0, -1))
			}
			kp := (k + 31) &^ 31
			got, want := make([]float32, m*kp), make([]float32, m*kp)
			for i := range got {
				got[i], want[i] = 7, 7
			}
			permuteX(m, k, x, got)
			permuteAsm = false
			permuteX(m, k, x, want)
			permuteAsm = true
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("m=%d k=%d: xs[%d] = %v, scalar %v", m, k, i, got[i], want[i])
				}
			}
		}
	}
}

// BenchmarkPermuteX: the scalar loop against the assembly chunks, same
// run, at the decode shapes of the shipped model (10 rows: 10 users).
func BenchmarkPermuteX(b *testing.B) {
	if !permuteAsm {
		b.Skip("no AVX2")
	}
	for _, asm := range []bool{false, true} {
		for _, k := range []int{384, 1024} {
			b.Run(fmt.Sprintf("asm=%v/m=10/k=%d", asm, k), func(b *testing.B) {
				permuteAsm = asm
				defer func() { permuteAsm = true }()
				r := rand.New(rand.NewPCG(1, 2))
				x, xs := randSlice(r, 10*k), make([]float32, 10*k)
				for b.Loop() {
					permuteX(10, k, x, xs)
				}
			})
		}
	}
}
