package cuda

import (
	"encoding/binary"
	"fmt"
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
		got := runEmu(t, bin, rows, masks, draws, tc.V)
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
func runEmu(t *testing.T, bin string, rows []float32, masks [][]uint64, draws []forward.Draw, V int) []forward.Drawn {
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
	ob := runEmulator(t, bin, buf, 8*len(draws))
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

// bf16Value is the value of bfloat16 bits h (exact in float64).
func bf16Value(h uint16) float64 { return float64(math.Float32frombits(uint32(h) << 16)) }

// runEmulator runs the emulator bin on the input in (written next to it)
// and returns its output, which must be want bytes.
func runEmulator(t *testing.T, bin string, in []byte, want int) []byte {
	t.Helper()
	inPath, outPath := bin+".in", bin+".out"
	if err := os.WriteFile(inPath, in, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command(bin, inPath, outPath).CombinedOutput(); err != nil {
		t.Fatalf("emulator: %v\n%s", err, msg)
	}
	out, err := os.ReadFile(outPath)
	if err != nil || len(out) != want {
		t.Fatalf("emulator output: %d bytes (want %d), %v", len(out), want, err)
	}
	return out
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

// TestAttentionKernelsEmulated runs kernels/llama.cu's four attention
// kernels (paged_attention_chunked, paged_attention_rope and their grouped
// _g forms) on the CPU through testdata/emu (one warp at a time on 32 OS
// threads, shuffles and ballots emulated) and compares each output with
// attention computed here in float64, their bf16 output (out16, what the
// bf16 GEMM path reads) with the float32 one rounded, and the rope
// kernels' cache stores with the rotated keys and the values: the kernels' indexing (block
// tables, slots, the chunk search, keys read from qkv rows), RoPE and
// online softmax are checked on machines without a GPU. Head dims 64 and
// 16 (16-byte loads, 8 lanes a key in the grouped form), 48 (8 lanes,
// element loads) and 40 (4 lanes); grouped-query and plain attention;
// odd block sizes; contexts that end inside, at and past a 32-key round;
// a prefill chunk that continues cached tokens, a prompt from position
// 0 and single-token decodes.
func TestAttentionKernelsEmulated(t *testing.T) {
	cxx := emulatorOrSkip(t, "TestForwardMatchesCPU")
	dir := t.TempDir()
	src := emulatedKernels(t)
	for _, tc := range []struct{ hd, nH, nKV, bs int }{
		{64, 4, 2, 2}, {16, 2, 2, 3}, {48, 4, 1, 5}, {40, 2, 1, 1},
	} {
		bin := filepath.Join(dir, fmt.Sprintf("attn%d", tc.hd))
		buildEmulator(t, cxx, bin, "llama.cpp", src, fmt.Sprintf("-DHEAD_DIM=%d", tc.hd))
		r := rand.New(rand.NewPCG(uint64(tc.hd), 5))
		sc := newAttnScene(r, tc.hd, tc.nH, tc.nKV, tc.bs)
		want := sc.reference()
		for which, name := range []string{"paged_attention_chunked", "paged_attention_chunked_g", "paged_attention_rope", "paged_attention_rope_g"} {
			out, kc, vc := sc.run(t, bin, which)
			worst := 0.0
			for i, w := range want {
				worst = max(worst, math.Abs(float64(out[i])-w)) // NaN fails below
				if math.IsNaN(float64(out[i])) {
					worst = math.Inf(1)
				}
			}
			t.Logf("head dim %d, %s: worst |Δ| %.2e", tc.hd, name, worst)
			if worst > 2e-5 {
				t.Errorf("head dim %d, %s: worst |Δ| against float64 attention %.3e > 2e-5", tc.hd, name, worst)
			}
			if which >= 2 {
				sc.checkStores(t, name, kc, vc)
			}
			// The bf16 output (out16, the served path): the same values
			// rounded once.
			out16, _, _ := sc.run(t, bin, which+4)
			for i, v := range toBF16(out) {
				if got := math.Float32bits(out16[i]); got != uint32(v)<<16 {
					t.Fatalf("head dim %d, %s: out16[%d] = %v, want bf16(%v)", tc.hd, name, i, out16[i], out[i])
				}
			}
		}
	}
}

// emulatedKernels is what testdata/emu/llama.cpp compiles: llama.cu and
// gemm.cu without the L2 prefetch instruction, the dynamic shared array a
// static one.
func emulatedKernels(t *testing.T) string {
	t.Helper()
	const smem = "extern __shared__ float4 smem4[];"
	if !strings.Contains(llamaSource, smem) {
		t.Fatalf("llama.cu declares no %q for the emulator to replace", smem)
	}
	return strings.NewReplacer(
		`extern "C" __global__`, `extern "C"`,
		`asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));`, `(void)(c + off);`,
		smem, fmt.Sprintf("static float4 smem4[%d];", gemvMaxShm/16),
	).Replace(llamaSource + "\n" + gemmSource)
}

// attnScene is one step of the attention kernels' input: sequences of
// cached tokens plus a chunk of new ones, laid out as the engine does
// (each sequence's chunk contiguous in T, its blocks scattered over the
// cache through its block table).
type attnScene struct {
	hd, nH, nKV, bs, maxPos int
	seqs                    []attnSeq
	nSlots, btStride, T     int
	cosSin                  []float32 // [maxPos, hd/2, 2]
	positions, slots, tok   []int32   // [T]
	tables                  []int32   // [S, btStride]
}

// attnSeq is one sequence: keys and values at every position (before
// RoPE), queries for its chunk's positions cached..cached+chunk-1, and
// its block table.
type attnSeq struct {
	cached, chunk int
	q             [][]float32 // [chunk][nH·hd]
	k, v          [][]float32 // [position][nKV·hd]
	table         []int32
}

func newAttnScene(r *rand.Rand, hd, nH, nKV, bs int) *attnScene {
	sc := &attnScene{hd: hd, nH: nH, nKV: nKV, bs: bs}
	// Chunks: continuing 37 cached tokens; a prompt; decodes whose keys
	// end inside, right at and one past a 32-key round; two tokens that
	// cross a round.
	for _, c := range [][2]int{{37, 5}, {0, 9}, {70, 1}, {31, 1}, {32, 1}, {30, 2}} {
		s := attnSeq{cached: c[0], chunk: c[1]}
		n := c[0] + c[1]
		sc.maxPos = max(sc.maxPos, n)
		vec := func(d int) []float32 {
			x := make([]float32, d)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			return x
		}
		for range n {
			s.k, s.v = append(s.k, vec(nKV*hd)), append(s.v, vec(nKV*hd))
		}
		for range c[1] {
			s.q = append(s.q, vec(nH*hd))
		}
		sc.seqs = append(sc.seqs, s)
	}
	// Physical blocks: a shuffled pool with room to spare.
	need := 0
	for _, s := range sc.seqs {
		need += (s.cached + s.chunk + bs - 1) / bs
		sc.btStride = max(sc.btStride, (s.cached+s.chunk+bs-1)/bs)
	}
	pool := r.Perm(need + 7)
	sc.nSlots = (need + 7) * bs
	for i := range sc.seqs {
		s := &sc.seqs[i]
		nb := (s.cached + s.chunk + bs - 1) / bs
		for range nb {
			s.table, pool = append(s.table, int32(pool[0])), pool[1:]
		}
		row := make([]int32, sc.btStride)
		copy(row, s.table)
		sc.tables = append(sc.tables, row...)
		for p := s.cached; p < s.cached+s.chunk; p++ {
			sc.positions = append(sc.positions, int32(p))
			sc.slots = append(sc.slots, sc.slot(s, p))
			sc.tok = append(sc.tok, int32(i))
		}
	}
	sc.T = len(sc.positions)
	// cos/sin as the backend uploads them: float32 of the float64 angle.
	half := hd / 2
	sc.cosSin = make([]float32, sc.maxPos*half*2)
	for p := range sc.maxPos {
		for i := range half {
			a := float64(p) / math.Pow(10000, float64(2*i)/float64(hd))
			sc.cosSin[(p*half+i)*2], sc.cosSin[(p*half+i)*2+1] = float32(math.Cos(a)), float32(math.Sin(a))
		}
	}
	return sc
}

// slot is position p's cache slot in sequence s.
func (sc *attnScene) slot(s *attnSeq, p int) int32 {
	return s.table[p/sc.bs]*int32(sc.bs) + int32(p%sc.bs)
}

// rope returns x (one head, hd values) rotated to position p in float64
// from the scene's float32 cos/sin, the kernels' rotate_half convention.
func (sc *attnScene) rope(x []float32, p int) []float64 {
	half := sc.hd / 2
	y := make([]float64, sc.hd)
	for i := range half {
		c, s := float64(sc.cosSin[(p*half+i)*2]), float64(sc.cosSin[(p*half+i)*2+1])
		x1, x2 := float64(x[i]), float64(x[i+half])
		y[i], y[i+half] = x1*c-x2*s, x2*c+x1*s
	}
	return y
}

// reference is the attention output [T, nH·hd] in float64.
func (sc *attnScene) reference() []float64 {
	hd, group := sc.hd, sc.nH/sc.nKV
	scale := 1 / math.Sqrt(float64(hd))
	var out []float64
	for _, s := range sc.seqs {
		for c := range s.chunk {
			pos := s.cached + c
			for h := range sc.nH {
				kvh := h / group
				q := sc.rope(s.q[c][h*hd:(h+1)*hd], pos)
				scores := make([]float64, pos+1)
				m := math.Inf(-1)
				for j := range scores {
					k := sc.rope(s.k[j][kvh*hd:(kvh+1)*hd], j)
					for d := range hd {
						scores[j] += q[d] * k[d] * scale
					}
					m = max(m, scores[j])
				}
				o, l := make([]float64, hd), 0.0
				for j, x := range scores {
					p := math.Exp(x - m)
					l += p
					for d := range hd {
						o[d] += p * float64(s.v[j][kvh*hd+d])
					}
				}
				for d := range o {
					out = append(out, o[d]/l)
				}
			}
		}
	}
	return out
}

// run writes the emulator's input for kernel which (0, 1: the chunked
// kernels, whose queries are rotated and whose chunk keys are cached
// already; 2, 3: the rope kernels, which find q, k, v unrotated in qkv
// and only the earlier keys in the cache; + 4: bf16 output), runs bin and
// returns the output (as float32) and the caches after the run. Slots
// nobody writes hold NaN.
func (sc *attnScene) run(t *testing.T, bin string, which int) (out, kc, vc []float32) {
	t.Helper()
	hd, nH, nKV := sc.hd, sc.nH, sc.nKV
	rot := which%4 < 2
	stride := (nH + 2*nKV) * hd
	qkv := make([]float32, 0, sc.T*stride)
	kvN := sc.nSlots * nKV * hd
	kc, vc = make([]float32, kvN), make([]float32, kvN)
	for i := range kc {
		kc[i], vc[i] = float32(math.NaN()), float32(math.NaN())
	}
	store := func(s *attnSeq, p int) {
		base := int(sc.slot(s, p)) * nKV * hd
		for h := range nKV {
			k := sc.rope(s.k[p][h*hd:(h+1)*hd], p)
			for d := range hd {
				kc[base+h*hd+d] = float32(k[d])
			}
		}
		copy(vc[base:base+nKV*hd], s.v[p])
	}
	for i := range sc.seqs {
		s := &sc.seqs[i]
		for p := range s.cached {
			store(s, p)
		}
		for c := range s.chunk {
			p := s.cached + c
			if rot {
				store(s, p)
				for h := range nH {
					for _, x := range sc.rope(s.q[c][h*hd:(h+1)*hd], p) {
						qkv = append(qkv, float32(x))
					}
				}
			} else {
				qkv = append(qkv, s.q[c]...)
			}
			qkv = append(append(qkv, s.k[p]...), s.v[p]...)
		}
	}
	var buf []byte
	put := func(v uint32) { buf = binary.LittleEndian.AppendUint32(buf, v) }
	scale := float32(1 / math.Sqrt(float64(hd)))
	for _, v := range []int{0, which, nH, nKV, sc.bs, sc.T, len(sc.seqs), sc.btStride, sc.nSlots, sc.maxPos} {
		put(uint32(v))
	}
	put(math.Float32bits(scale))
	for _, a := range [][]float32{qkv, kc, vc, sc.cosSin} {
		for _, x := range a {
			put(math.Float32bits(x))
		}
	}
	for _, a := range [][]int32{sc.positions, sc.slots, sc.tok, sc.tables} {
		for _, x := range a {
			put(uint32(x))
		}
	}
	nOut := sc.T * nH * hd
	ob := runEmulator(t, bin, buf, 4*(nOut+2*kvN))
	f := func(i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(ob[4*i:])) }
	out = make([]float32, nOut)
	for i := range out {
		out[i] = f(i)
	}
	for i := range kvN {
		kc[i], vc[i] = f(nOut+i), f(nOut+kvN+i)
	}
	return out, kc, vc
}

// checkStores checks a rope kernel's cache stores: every chunk token's
// slot holds its rotated key and its value (exact).
func (sc *attnScene) checkStores(t *testing.T, name string, kc, vc []float32) {
	t.Helper()
	hd, nKV := sc.hd, sc.nKV
	for i := range sc.seqs {
		s := &sc.seqs[i]
		for p := s.cached; p < s.cached+s.chunk; p++ {
			base := int(sc.slot(s, p)) * nKV * hd
			for h := range nKV {
				k := sc.rope(s.k[p][h*hd:(h+1)*hd], p)
				for d := range hd {
					if got := kc[base+h*hd+d]; !(math.Abs(float64(got)-k[d]) <= 1e-5) {
						t.Fatalf("head dim %d, %s: seq %d position %d KV head %d: cached key[%d] %v, want %v", hd, name, i, p, h, d, got, k[d])
					}
				}
			}
			for d, want := range s.v[p] {
				if got := vc[base+d]; math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("head dim %d, %s: seq %d position %d: cached value[%d] %v, want %v", hd, name, i, p, d, got, want)
				}
			}
		}
	}
}

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
	buildEmulator(t, cxx, bin, "llama.cpp", emulatedKernels(t), "-DHEAD_DIM=64")
	r := rand.New(rand.NewPCG(3, 4))
	const eps = 1e-5
	bf := func(v float32) float64 { return bf16Value(toBF16([]float32{v})[0]) }
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
					s += a[m*tc.K+k] * bf16Value(w16[n*tc.K+k])
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
	for _, v := range []int{1, M, K, N, which} { // op 1: GEMM
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
	n, size := M*N/2, 2
	if which == 2 {
		n, size = M*N, 4
	}
	ob := runEmulator(t, bin, buf, size*n)
	res := make([]float64, n)
	for i := range res {
		if size == 2 {
			res[i] = bf16Value(binary.LittleEndian.Uint16(ob[2*i:]))
		} else {
			res[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(ob[4*i:])))
		}
	}
	return res
}

// TestSiLUMul16Emulated runs llama.cu's silu_mul16 (Options.GateUpBF16) on
// the CPU through testdata/emu and compares each output with
// bf16(SiLU(gate)·up) of the bf16 inputs computed here: the 16-byte
// pieces, the gate/up halves of each row and the grid-stride loop (grids
// smaller and larger than the work) are checked without a GPU.
func TestSiLUMul16Emulated(t *testing.T) {
	cxx := emulatorOrSkip(t, "TestForwardMatchesCPU")
	bin := filepath.Join(t.TempDir(), "silu")
	buildEmulator(t, cxx, bin, "llama.cpp", emulatedKernels(t), "-DHEAD_DIM=64")
	r := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct{ T, ffn, grid int }{{1, 64, 1}, {3, 1024, 1}, {70, 88, 2}, {5, 16, 9}} {
		gu := make([]float32, tc.T*2*tc.ffn)
		for i := range gu {
			gu[i] = float32(r.NormFloat64() * 4)
		}
		gu16 := toBF16(gu)
		var buf []byte
		for _, v := range []int{2, tc.T, tc.ffn, tc.grid} { // op 2: silu_mul16
			buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
		}
		for _, v := range gu16 {
			buf = binary.LittleEndian.AppendUint16(buf, v)
		}
		ob := runEmulator(t, bin, buf, 2*tc.T*tc.ffn)
		for m := range tc.T {
			for i := range tc.ffn {
				g, u := bf16Value(gu16[m*2*tc.ffn+i]), bf16Value(gu16[m*2*tc.ffn+tc.ffn+i])
				want := g / (1 + math.Exp(-g)) * u
				got := bf16Value(binary.LittleEndian.Uint16(ob[2*(m*tc.ffn+i):]))
				// One bf16 rounding of the float32 product.
				if d := math.Abs(got - want); !(d <= math.Abs(want)/256+1e-30) {
					t.Fatalf("T %d ffn %d grid %d: act[%d, %d] = %v, want %v", tc.T, tc.ffn, tc.grid, m, i, got, want)
				}
			}
		}
	}
}
