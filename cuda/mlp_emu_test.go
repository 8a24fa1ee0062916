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

// TestFusedMLPKernelEmulated runs kernels/mlp.cu's gemm_gu_silu on the CPU
// through testdata/emu (one block at a time, mma.sync emulated from its
// fragment layouts) and compares every output with SiLU(x·gate)·(x·up)
// computed here in float64 from the same bf16 inputs, within the one bf16
// rounding of the output: the tiling, the stage buffers, the fragment
// loads and the epilogue's column pairing are checked without a GPU.
// Token counts below, at and past a 64-row tile, K of one to four stages,
// one and two column tiles, and MLP sizes that end inside a tile (what
// lies past M or the MLP size is neither read nor written).
func TestFusedMLPKernelEmulated(t *testing.T) {
	cxx := emulatorOrSkip(t, "TestForwardMatchesCPU")
	bin := filepath.Join(t.TempDir(), "gemm")
	buildEmulator(t, cxx, bin, "gemm.cpp", emulatedLlama(t)+"\n"+strings.ReplaceAll(mlpSource, `extern "C" __global__`, `extern "C"`), "-DHEAD_DIM=64")
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct{ M, K, ffn int }{{1, 64, 64}, {5, 96, 64}, {64, 32, 128}, {70, 128, 64}, {130, 64, 64}, {9, 64, 88}, {3, 32, 30}} {
		bf := func(n int, sd float64) []uint16 {
			s := make([]float32, n)
			for i := range s {
				s[i] = float32(r.NormFloat64() * sd)
			}
			return toBF16(s)
		}
		x, w := bf(tc.M*tc.K, 1), bf(2*tc.ffn*tc.K, 0.2)
		got := runMLPEmu(t, bin, tc.M, tc.K, tc.ffn, x, w)
		f := func(h uint16) float64 { return float64(math.Float32frombits(uint32(h) << 16)) }
		worst := 0.0
		for m := range tc.M {
			for j := range tc.ffn {
				var gate, up float64
				for k := range tc.K {
					xv := f(x[m*tc.K+k])
					gate += xv * f(w[(2*j)*tc.K+k])
					up += xv * f(w[(2*j+1)*tc.K+k])
				}
				want := gate / (1 + math.Exp(-gate)) * up
				g := f(got[m*tc.ffn+j])
				// One bf16 rounding (2⁻⁹ relative) and float32 sums.
				if d := math.Abs(g - want); !(d <= math.Abs(want)/256+1e-5) {
					t.Fatalf("M %d K %d ffn %d: act[%d, %d] = %v, want %v", tc.M, tc.K, tc.ffn, m, j, g, want)
				} else if want != 0 {
					worst = max(worst, d/math.Abs(want))
				}
			}
		}
		t.Logf("M %d K %d ffn %d: worst relative |Δ| %.2e", tc.M, tc.K, tc.ffn, worst)
	}
}

// runMLPEmu writes the emulator's input, runs bin and returns act [M, ffn]
// as bf16 bits.
func runMLPEmu(t *testing.T, bin string, M, K, ffn int, x, w []uint16) []uint16 {
	t.Helper()
	var buf []byte
	for _, v := range []int{M, K, ffn} {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
	}
	for _, a := range [][]uint16{x, w} {
		for _, v := range a {
			buf = binary.LittleEndian.AppendUint16(buf, v)
		}
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
