//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"simd/archsimd"
)

// exp8 must agree with math.Exp lane by lane, including the clamped and
// zeroed ranges.
func TestExp8(t *testing.T) {
	if !hasAVX2FMA {
		t.Skip("CPU lacks AVX2/FMA")
	}
	r := rand.New(rand.NewPCG(3, 4))
	in := make([]float32, 0, 8016)
	in = append(in, 0, 1, -1, 88, -87, float32(math.Inf(-1)), -200, -87.5, 0.3465736, -0.3465736)
	for len(in) < cap(in) {
		in = append(in, float32(r.Float64()*175-87))
	}
	for i := 0; i+8 <= len(in); i += 8 {
		var out [8]float32
		exp8(archsimd.LoadFloat32x8Slice(in[i:])).Store(&out)
		for l, x := range in[i : i+8] {
			want := math.Exp(float64(x))
			if x < expMin {
				want = 0
			}
			if got := float64(out[l]); math.Abs(got-want) > 3e-7*want {
				t.Fatalf("exp8(%v) = %v, want %v", x, got, want)
			}
		}
	}
}
