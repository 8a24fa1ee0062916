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

// TestTensorCoreGEMMsEmulated runs kernels/gemm.cu's three entry points
// on the CPU through testdata/emu (one block at a time, mma.sync emulated
// from its fragment layouts) and compares every output with the product
// computed here in float64 from the kernel's bf16 inputs: a = x in bf16
// (gemm_gu_silu) or a = bf16(x ⊙ norm weight) with the dot products scaled
// by 1/sqrt(mean(x²) + eps) (gemm_gu_silu_norm, gemm_norm); SiLU(gate)·up
// of each interleaved column pair within the output's one bf16 rounding,
// or the float32 products themselves (gemm_norm). The tiling, the stage
// buffers, the fragment loads, the row scales and both epilogues are
// checked without a GPU. Token counts below, at and past a 64-row tile, K
// of one to four stages, one and two column tiles, and widths that end
// inside a tile (what lies past M or N is neither read nor written).
func TestTensorCoreGEMMsEmulated(t *testing.T) {
	cxx := emulatorOrSkip(t, "TestForwardMatchesCPU")
	bin := filepath.Join(t.TempDir(), "gemm")
	buildEmulator(t, cxx, bin, "gemm.cpp", emulatedLlama(t)+"\n"+strings.ReplaceAll(gemmSource, `extern "C" __global__`, `extern "C"`), "-DHEAD_DIM=64")
	r := rand.New(rand.NewPCG(3, 4))
	const eps = 1e-5
	bf := func(v float32) float64 { return float64(math.Float32frombits(uint32(toBF16([]float32{v})[0]) << 16)) }
	for which, name := range []string{"gemm_gu_silu", "gemm_gu_silu_norm", "gemm_norm"} {
		norm := which > 0
		for _, tc := range []struct{ M, K, N int }{{1, 64, 128}, {5, 96, 128}, {64, 32, 256}, {70, 128, 128}, {130, 64, 128}, {9, 64, 176}, {3, 32, 60}} {
			x, nw := make([]float32, tc.M*tc.K), make([]float32, tc.K)
			for i := range x {
				x[i] = float32(r.NormFloat64() * 3)
			}
			for i := range nw {
				nw[i] = float32(0.5 + r.Float64())
			}
			w := make([]float32, tc.N*tc.K)
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
			dot := func(m, n int) float64 {
				var s float64
				for k := range tc.K {
					s += a[m*tc.K+k] * float64(math.Float32frombits(uint32(w16[n*tc.K+k])<<16))
				}
				return s * scale[m]
			}
			got := runGEMMEmu(t, bin, tc.M, tc.K, tc.N, which, eps, x, nw, w16)
			worst := 0.0
			for m := range tc.M {
				if which == 2 {
					for n := range tc.N {
						want, g := dot(m, n), got[m*tc.N+n]
						// float32 products and sums: a few ulps of the terms' size.
						if d := math.Abs(g - want); !(d <= 1e-5*(1+math.Abs(want))) {
							t.Fatalf("%s, M %d K %d N %d: y[%d, %d] = %v, want %v", name, tc.M, tc.K, tc.N, m, n, g, want)
						}
					}
					continue
				}
				for j := range tc.N / 2 {
					gate, up := dot(m, 2*j), dot(m, 2*j+1)
					want := gate / (1 + math.Exp(-gate)) * up
					g := got[m*(tc.N/2)+j]
					// One bf16 rounding (at most 2⁻⁸ relative) and float32 sums.
					if d := math.Abs(g - want); !(d <= math.Abs(want)/256+1e-4) {
						t.Fatalf("%s, M %d K %d N %d: act[%d, %d] = %v, want %v", name, tc.M, tc.K, tc.N, m, j, g, want)
					} else if math.Abs(want) > 1e-2 {
						worst = max(worst, d/math.Abs(want))
					}
				}
			}
			t.Logf("%s, M %d K %d N %d: worst relative |Δ| of SiLU·up %.2e (outputs over 0.01)", name, tc.M, tc.K, tc.N, worst)
		}
	}
}

// runGEMMEmu writes the emulator's input (x as bf16 for gemm_gu_silu,
// float32 with nw after it for the norm forms), runs bin and returns the
// output as float64: act [M, N/2] (bf16 values) or y [M, N].
func runGEMMEmu(t *testing.T, bin string, M, K, N, which int, eps float32, x, nw []float32, w []uint16) []float64 {
	t.Helper()
	var buf []byte
	for _, v := range []int{M, K, N, which} {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
	}
	buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(eps))
	if which > 0 {
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
	n, size := M*N/2, 2
	if which == 2 {
		n, size = M*N, 4
	}
	if err != nil || len(ob) != size*n {
		t.Fatalf("emulator output: %d bytes, %v", len(ob), err)
	}
	res := make([]float64, n)
	for i := range res {
		if size == 2 {
			res[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(ob[2*i:])) << 16))
		} else {
			res[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(ob[4*i:])))
		}
	}
	return res
}
