package cuda

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"chunlian/model"
	"chunlian/sampler"
)

// rowLSEOnDevice runs the row_lse kernel on rows (each of length V) and
// returns its outputs: the kernel alone, on crafted inputs a model would
// rarely produce.
func (b *Backend) rowLSEOnDevice(rows [][]float32, V int) ([]float32, error) {
	flat := make([]float32, 0, len(rows)*V)
	for _, r := range rows {
		flat = append(flat, r...)
	}
	out := make([]float32, len(rows))
	err := b.do(func() error {
		in, err := b.upload(flat)
		if err != nil {
			return err
		}
		defer b.free(in)
		o, err := b.alloc(int64(len(rows)) * 4)
		if err != nil {
			return err
		}
		defer b.free(o)
		if err := b.launch("row_lse", len(rows), 1, rowLSEThreads, uint64(o), uint64(in), i32(V)); err != nil {
			return err
		}
		d := &b.l.drv
		if err := d.call("cuMemcpyDtoHAsync", d.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&out[0])), o, uintptr(len(out)*4), b.stream); err != nil {
			return err
		}
		return b.sync()
	})
	return out, err
}

// lseClose: GPU (float32, block-reduced) vs host (float64 sum) log-sum-exp
// agree to 1e-5 relative, and infinities match exactly.
func lseClose(got float32, want float64) bool {
	if math.IsInf(want, 0) || math.IsNaN(want) {
		return float64(got) == want || (math.IsNaN(want) && got != got)
	}
	return math.Abs(float64(got)-want) <= 1e-5*math.Max(1, math.Abs(want))
}

// TestRowLSEKernel compares the row_lse kernel with sampler.LogSumExp, the
// host function the engine would otherwise call, on rows with NaNs, -Inf
// entries, all -Inf, +Inf, large offsets and a one-hot row.
func TestRowLSEKernel(t *testing.T) {
	gpuOrSkip(t)
	g, err := New(model.NewRandom(model.TestConfig(), 1), Options{KVCacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const V = 6294 // the trained model's vocabulary: not a multiple of the block
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	mk := func(f func(i int) float32) []float32 {
		r := make([]float32, V)
		for i := range r {
			r[i] = f(i)
		}
		return r
	}
	cases := map[string][]float32{
		"ramp":        mk(func(i int) float32 { return float32(i%97)/10 - 3 }),
		"offset +80":  mk(func(i int) float32 { return 80 + float32(i%13)/7 }),
		"offset -90":  mk(func(i int) float32 { return -90 - float32(i%11)/3 }),
		"one-hot":     mk(func(i int) float32 { return map[bool]float32{true: 30, false: -30}[i == 4321] }),
		"some -Inf":   mk(func(i int) float32 { return map[bool]float32{true: -inf, false: float32(i%7) / 2}[i%3 == 0] }),
		"some NaN":    mk(func(i int) float32 { return map[bool]float32{true: nan, false: float32(i%5) - 1}[i%10 == 1] }),
		"all -Inf":    mk(func(int) float32 { return -inf }),
		"NaN + -Inf":  mk(func(i int) float32 { return map[bool]float32{true: nan, false: -inf}[i%2 == 0] }),
		"one +Inf":    mk(func(i int) float32 { return map[bool]float32{true: inf, false: 1}[i == 17] }),
		"last only":   mk(func(i int) float32 { return map[bool]float32{true: 5, false: -inf}[i == V-1] }),
		"all equal 0": mk(func(int) float32 { return 0 }),
	}
	var names []string
	var rows [][]float32
	for n, r := range cases {
		names, rows = append(names, n), append(rows, r)
	}
	got, err := g.rowLSEOnDevice(rows, V)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range names {
		want := sampler.LogSumExp(rows[i])
		if !lseClose(got[i], want) {
			t.Errorf("%s: GPU log-sum-exp %v, host %v", n, got[i], want)
		}
	}
}

// TestGEMVConstantsMatchKernels keeps the Go launch constants and the
// kernel source's macros in step (a mismatch would compute garbage).
func TestGEMVConstantsMatchKernels(t *testing.T) {
	for _, want := range []string{
		"#define GEMV_MAX_M " + strconv.Itoa(gemvMaxM) + "\n",
		"#define GEMV_THREADS " + strconv.Itoa(gemvThreads) + "\n",
	} {
		if !strings.Contains(llamaSource, want) {
			t.Errorf("kernels/llama.cu lacks %q", strings.TrimSpace(want))
		}
	}
}

func TestGEMVShapes(t *testing.T) {
	for _, tc := range []struct {
		d, ffn, nq int
		want       bool
	}{
		{384, 1024, 384, true},  // the trained model
		{64, 176, 64, true},     // model.TestConfig
		{384, 1536, 384, true},  // 8 rows × 1536 × 4 B = 48 KiB exactly
		{384, 1540, 384, false}, // over 48 KiB of shared memory
		{384, 90, 384, false},   // K not a multiple of 4
		{2, 8, 8, false},
	} {
		if got := gemvShapesOK(tc.d, tc.ffn, tc.nq); got != tc.want {
			t.Errorf("gemvShapesOK(%d, %d, %d) = %v, want %v", tc.d, tc.ffn, tc.nq, got, tc.want)
		}
	}
}

func TestBF16Conversion(t *testing.T) {
	f := math.Float32frombits
	for _, tc := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{f(0x3f808000), 0x3f80}, // halfway, even below: down
		{f(0x3f818000), 0x3f82}, // halfway, odd below: up
		{f(0x3f808001), 0x3f81}, // above halfway: up
		{f(0x3f807fff), 0x3f80},
		{float32(math.Inf(-1)), 0xff80},
		{0, 0},
	} {
		if got := toBF16([]float32{tc.in})[0]; got != tc.want {
			t.Errorf("toBF16(%#08x) = %#04x, want %#04x", math.Float32bits(tc.in), got, tc.want)
		}
	}
	if got := toBF16([]float32{float32(math.NaN())})[0]; got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("NaN → %#04x, not a NaN", got)
	}
	for _, tc := range []struct {
		s    []float32
		want bool
	}{
		{[]float32{1, -2, 0.5, f(0x3f810000)}, true},
		{[]float32{1, f(0x3f810001)}, false},
		{nil, true},
	} {
		if got := bf16Exact(tc.s); got != tc.want {
			t.Errorf("bf16Exact(%v) = %v", tc.s, got)
		}
	}
}
