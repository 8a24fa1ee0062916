package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFusedMLPKernelEmulated runs kernels/mlp.cu's gemm_gu_silu and
// gemm_gu_silu_norm on the CPU through testdata/emu (one block at a time,
// mma.sync emulated from its fragment layouts) and compares every output
// with SiLU(a·gate)·(a·up) computed here in float64 from the kernel's bf16
// inputs (for the norm form: a = bf16(x ⊙ norm weight), the dot products
// scaled by 1/sqrt(mean(x²) + eps)), within the one bf16 rounding of the
// output: the tiling, the stage buffers, the fragment loads, the row
// scales and the epilogue's column pairing are checked without a GPU.
// Token counts below, at and past a 64-row tile, K of one to four stages,
// one and two column tiles, and MLP sizes that end inside a tile (what
// lies past M or the MLP size is neither read nor written).
func TestFusedMLPKernelEmulated(t *testing.T) {
	cxx := emulatorOrSkip(t, "TestForwardMatchesCPU")
	bin := filepath.Join(t.TempDir(), "gemm")
	buildEmulator(t, cxx, bin, "gemm.cpp", emulatedLlama(t)+"\n"+strings.ReplaceAll(mlpSource, `extern "C" __global__`, `extern "C"`), "-DHEAD_DIM=64")
	r := rand.New(rand.NewPCG(3, 4))
	const eps = 1e-5
	bf := func(v float32) float64 { return float64(math.Float32frombits(uint32(toBF16([]float32{v})[0]) << 16)) }
	for _, norm := range []bool{false, true} {
		for _, tc := range []struct{ M, K, ffn int }{{1, 64, 64}, {5, 96, 64}, {64, 32, 128}, {70, 128, 64}, {130, 64, 64}, {9, 64, 88}, {3, 32, 30}} {
			x, nw := make([]float32, tc.M*tc.K), make([]float32, tc.K)
			for i := range x {
				x[i] = float32(r.NormFloat64() * 3)
			}
			for i := range nw {
				nw[i] = float32(0.5 + r.Float64())
			}
			w := make([]float32, 2*tc.ffn*tc.K)
			for i := range w {
				w[i] = float32(r.NormFloat64() * 0.2)
			}
			w16 := toBF16(w)
			// a: the GEMM's bf16 input rows as the kernel forms them; scale:
			// each row's factor on the dot products.
			a, scale := make([]float64, len(x)), make([]float64, tc.M)
			for m := range tc.M {
				scale[m] = 1
				var ss float64
				for k := range tc.K {
					v := x[m*tc.K+k]
					if norm {
						ss += float64(v) * float64(v)
						a[m*tc.K+k] = bf(v * nw[k])
					} else {
						a[m*tc.K+k] = bf(v)
					}
				}
				if norm {
					scale[m] = 1 / math.Sqrt(ss/float64(tc.K)+eps)
				}
			}
			got := runMLPEmu(t, bin, tc.M, tc.K, tc.ffn, norm, eps, x, nw, w16)
			f := func(h uint16) float64 { return float64(math.Float32frombits(uint32(h) << 16)) }
			worst := 0.0
			for m := range tc.M {
				for j := range tc.ffn {
					var gate, up float64
					for k := range tc.K {
						gate += a[m*tc.K+k] * f(w16[(2*j)*tc.K+k])
						up += a[m*tc.K+k] * f(w16[(2*j+1)*tc.K+k])
					}
					gate, up = gate*scale[m], up*scale[m]
					want := gate / (1 + math.Exp(-gate)) * up
					g := f(got[m*tc.ffn+j])
					// One bf16 rounding (at most 2⁻⁸ relative) and float32 sums.
					if d := math.Abs(g - want); !(d <= math.Abs(want)/256+1e-4) {
						t.Fatalf("norm %v, M %d K %d ffn %d: act[%d, %d] = %v, want %v", norm, tc.M, tc.K, tc.ffn, m, j, g, want)
					} else if math.Abs(want) > 1e-2 {
						worst = max(worst, d/math.Abs(want))
					}
				}
			}
			t.Logf("norm %v, M %d K %d ffn %d: worst relative |Δ| %.2e (outputs over 0.01)", norm, tc.M, tc.K, tc.ffn, worst)
		}
	}
}

// runMLPEmu writes the emulator's input (x as bf16 without norm, float32
// with nw after it with norm), runs bin and returns act [M, ffn] as bf16
// bits.
func runMLPEmu(t *testing.T, bin string, M, K, ffn int, norm bool, eps float32, x, nw []float32, w []uint16) []uint16 {
	t.Helper()
	var buf []byte
	n := 0
	if norm {
		n = 1
	}
	for _, v := range []int{M, K, ffn, n} {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
	}
	buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(eps))
	if norm {
		for _, a := range [][]float32{x, nw} {
			for _, v := range a {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			}
		}
	} else {
		for _, v := range toBF16(x) {
			buf = binary.LittleEndian.AppendUint16(buf, v)
		}
	}
	for _, v := range w {
		buf = binary.LittleEndian.AppendUint16(buf, v)
	}
	in, out := bin+".in", bin+".out"
	if err := os.WriteFile(in, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command(bin, in, out).CombinedOutput(); err != nil {
		t.Fatalf("emulator: %v\n%s", err, msg)
	}
	ob, err := os.ReadFile(out)
	if err != nil || len(ob) != 2*M*ffn {
		t.Fatalf("emulator output: %d bytes, %v", len(ob), err)
	}
	act := make([]uint16, M*ffn)
	for i := range act {
		act[i] = binary.LittleEndian.Uint16(ob[2*i:])
	}
	return act
}
