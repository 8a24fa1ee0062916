package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"chunlian/forward"
)

// TestDrawKernelEmulated runs kernels/draw.cu's draw_rows itself, compiled
// by the host's C++ compiler against testdata/emu/shim.h (every block
// on DRAW_THREADS OS threads, __syncthreads a barrier, warp shuffles
// emulated), on draws packed by packDraws, and compares each result with
// sampler.DrawRow: the kernel's logic (masking, reductions, the prefix
// scan over thread chunks, the rejection rounds, the U words) is checked
// on machines without a GPU. Rows: peaked, flat, many ties, NaN and -Inf,
// one dominant token, large offsets, nearly all -Inf; vocabularies smaller
// than the block and the shipped model's; 64 and 512 threads. It needs
// g++ with C++20 (<barrier>); it skips without g++, under -short and
// where a GPU is usable (emulatorOrSkip).
func TestDrawKernelEmulated(t *testing.T) {
	cxx := emulatorOrSkip(t, "TestForwardDrawMatchesDrawRow")
	dir := t.TempDir()
	src := strings.NewReplacer(
		"extern __shared__ float dp[];", "", // the shim's global
		`extern "C" __global__`, `extern "C"`,
	).Replace(drawSource)
	for _, tc := range []struct {
		threads, V, perRow int
	}{
		{64, 6189, 25},
		{64, 33, 10}, // V < the block: empty chunks
		{64, 1000, 15},
		{512, 6189, 2},
		{512, 700, 2},
	} {
		bin := filepath.Join(dir, "emu"+strconv.Itoa(tc.threads))
		if _, err := os.Stat(bin); err != nil {
			k := strings.Replace(src, "#define DRAW_THREADS 512\n", "#define DRAW_THREADS "+strconv.Itoa(tc.threads)+"\n", 1)
			buildEmulator(t, cxx, bin, "draw.cpp", k)
		}
		r := rand.New(rand.NewPCG(uint64(tc.V), uint64(tc.threads)))
		rows := emuRows(r, 16, tc.V)
		masks := drawTestMasks(tc.V, r)
		draws := makeDraws(r, rows, tc.V, tc.perRow, len(masks))
		for i := range draws { // parameters beyond the engine's grid
			d := &draws[i]
			switch r.IntN(8) {
			case 0:
				d.Temperature = 1e9 // p rounds to 1 for many tokens: ties with im
			case 1:
				d.TopK = 1
			case 2:
				d.TopP, d.MinP = 0.1, 0.5
			case 3:
				d.U = 0
			}
		}
		got := runEmu(t, bin, dir, rows, masks, draws, tc.V)
		var sampled, differ int
		for i, d := range draws {
			row := rows[int(d.Row)*tc.V : (int(d.Row)+1)*tc.V]
			want := refDraw(row, masks, d)
			o := got[i]
			if o.Tok >= 0 && int(o.Tok) < tc.V && math.Float32bits(o.Logit) != math.Float32bits(row[o.Tok]) {
				t.Errorf("V %d draw %d: logit %v, row %v", tc.V, i, o.Logit, row[o.Tok])
			}
			if d.Force >= 0 || d.Temperature == 0 || want == -1 || o.Tok == -1 {
				if o.Tok != want {
					t.Errorf("V %d draw %d (%+v): token %d, DrawRow %d", tc.V, i, d, o.Tok, want)
				}
				continue
			}
			sampled++
			if o.Tok != want {
				differ++
				t.Logf("V %d draw %d (%+v): token %d, DrawRow %d", tc.V, i, d, o.Tok, want)
			}
		}
		t.Logf("%d threads, V %d: %d draws, %d sampled, %d differ from DrawRow", tc.threads, tc.V, len(draws), sampled, differ)
		// Only the order of the float64 sums differs from DrawRow.
		if float64(differ) > 0.01*float64(sampled) {
			t.Errorf("%d threads, V %d: %d of %d sampled draws differ", tc.threads, tc.V, differ, sampled)
		}
	}
}

// emuRows returns R rows of V logits of eight kinds (see the test).
func emuRows(r *rand.Rand, R, V int) []float32 {
	rows := make([]float32, R*V)
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	for k := range R {
		row := rows[k*V : (k+1)*V]
		for i := range row {
			switch k % 8 {
			case 0: // peaked, like the trained model
				row[i] = float32(r.NormFloat64()*2 - 5)
			case 1: // flat
				row[i] = float32(r.NormFloat64() * 0.3)
			case 2: // ties
				row[i] = float32(r.IntN(6))
			case 3:
				row[i] = float32(r.NormFloat64() * 3)
				if r.IntN(10) == 0 {
					row[i] = nan
				} else if r.IntN(10) == 0 {
					row[i] = inf
				}
			case 4:
				row[i] = float32(r.NormFloat64())
			case 5: // large offset
				row[i] = float32(80 + r.NormFloat64()*4)
			case 6: // nearly all -Inf
				row[i] = inf
				if r.IntN(500) == 0 {
					row[i] = float32(r.NormFloat64())
				}
			default:
				row[i] = float32(r.NormFloat64() * 6)
			}
		}
		switch k % 8 {
		case 0:
			for range 5 {
				row[r.IntN(V)] = float32(5 + r.NormFloat64()*2)
			}
		case 4:
			row[r.IntN(V)] = 15
		}
	}
	return rows
}

// runEmu writes the emulator's input (the masks padded or cut to the
// vocabulary's words as RegisterMask does, the specs as packDraws packs
// them), runs bin and returns its results.
func runEmu(t *testing.T, bin, dir string, rows []float32, masks [][]uint64, draws []forward.Draw, V int) []forward.Drawn {
	t.Helper()
	R, W := len(rows)/V, (V+63)/64
	packed, err := packDraws(nil, draws, nil, R, V, len(masks))
	if err != nil {
		t.Fatal(err)
	}
	nSpec := len(draws) * drawWords
	var buf []byte
	put := func(v uint32) { buf = binary.LittleEndian.AppendUint32(buf, v) }
	for _, v := range []int{V, R, len(masks), W, len(draws), len(packed) - nSpec} {
		put(uint32(v))
	}
	for _, m := range masks {
		w := make([]uint64, W)
		copy(w, m)
		for _, x := range w {
			buf = binary.LittleEndian.AppendUint64(buf, x)
		}
	}
	for _, x := range rows {
		put(math.Float32bits(x))
	}
	for _, x := range packed {
		put(uint32(x))
	}
	in, out := filepath.Join(dir, "in.bin"), filepath.Join(dir, "out.bin")
	if err := os.WriteFile(in, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command(bin, in, out).CombinedOutput(); err != nil {
		t.Fatalf("emulator: %v\n%s", err, msg)
	}
	ob, err := os.ReadFile(out)
	if err != nil || len(ob) != 8*len(draws) {
		t.Fatalf("emulator output: %d bytes, %v", len(ob), err)
	}
	res := make([]forward.Drawn, len(draws))
	for i := range res {
		res[i] = forward.Drawn{Tok: int32(binary.LittleEndian.Uint32(ob[8*i:])), Logit: math.Float32frombits(binary.LittleEndian.Uint32(ob[8*i+4:]))}
	}
	return res
}

// emulatorOrSkip skips an emulated-kernel test under -short, where a GPU is
// usable (gpuTest runs the kernel itself there) and without g++; it
// returns g++'s path.
func emulatorOrSkip(t *testing.T, gpuTest string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short")
	}
	if ok, _ := Available(""); ok {
		t.Skip("a GPU is here: " + gpuTest + " runs the kernel itself")
	}
	cxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++")
	}
	return cxx
}

// buildEmulator compiles testdata/emu/main (with shim.h) into bin, with
// src as its kernel.inc (written into bin's directory) and the extra
// compiler flags.
func buildEmulator(t *testing.T, cxx, bin, main, src string, flags ...string) {
	t.Helper()
	dir := filepath.Dir(bin)
	if err := os.WriteFile(filepath.Join(dir, "kernel.inc"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs("testdata/emu")
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-std=c++20", "-O2", "-ffp-contract=off", "-pthread", "-I", dir, "-I", abs}, flags...)
	cmd := exec.Command(cxx, append(args, "-o", bin, filepath.Join(abs, main))...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
}
