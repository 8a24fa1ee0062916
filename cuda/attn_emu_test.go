package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAttentionKernelsEmulated runs kernels/llama.cu's four attention
// kernels (paged_attention_chunked, paged_attention_rope and their grouped
// _g forms) on the CPU through testdata/emu (one warp at a time on 32 OS
// threads, shuffles and ballots emulated) and compares each output with
// attention computed here in float64, and the rope kernels' cache stores
// with the rotated keys and the values: the kernels' indexing (block
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
	src := emulatedLlama(t)
	for _, tc := range []struct{ hd, nH, nKV, bs int }{
		{64, 4, 2, 2}, {16, 2, 2, 3}, {48, 4, 1, 5}, {40, 2, 1, 1},
	} {
		bin := filepath.Join(dir, fmt.Sprintf("attn%d", tc.hd))
		buildEmulator(t, cxx, bin, "attn.cpp", src, fmt.Sprintf("-DHEAD_DIM=%d", tc.hd))
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
		}
	}
}

// emulatedLlama is the part of llama.cu the emulator compiles: its helpers
// and kernels through the attention kernels (the GEMV kernels after them
// need dynamic shared memory), without the L2 prefetch instruction.
func emulatedLlama(t *testing.T) string {
	t.Helper()
	const marker = "// silu_mul: act[t, i]"
	cut := strings.Index(llamaSource, marker)
	if cut < 0 {
		t.Fatalf("llama.cu has no %q: the emulated part (through the attention kernels) ends there", marker)
	}
	return strings.NewReplacer(
		`extern "C" __global__`, `extern "C"`,
		`asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));`, `(void)(c + off);`,
	).Replace(llamaSource[:cut])
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
// and only the earlier keys in the cache), runs bin and returns the
// output and the caches after the run. Slots nobody writes hold NaN.
func (sc *attnScene) run(t *testing.T, bin string, which int) (out, kc, vc []float32) {
	t.Helper()
	hd, nH, nKV := sc.hd, sc.nH, sc.nKV
	rot := which < 2
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
	for _, v := range []int{which, nH, nKV, sc.bs, sc.T, len(sc.seqs), sc.btStride, sc.nSlots, sc.maxPos} {
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
	in, outPath := bin+".in", bin+".out"
	if err := os.WriteFile(in, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command(bin, in, outPath).CombinedOutput(); err != nil {
		t.Fatalf("emulator: %v\n%s", err, msg)
	}
	ob, err := os.ReadFile(outPath)
	nOut := sc.T * nH * hd
	if err != nil || len(ob) != 4*(nOut+2*kvN) {
		t.Fatalf("emulator output: %d bytes, %v", len(ob), err)
	}
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
