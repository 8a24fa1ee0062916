package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"chunlian/forward"
	"chunlian/model"
)

// Options configure the CUDA backend.
type Options struct {
	// Device is the CUDA device ordinal (default 0).
	Device int
	// LibDir is an extra directory searched first for libcuda, libnvrtc and
	// libcublas (the --cuda-lib-dir flag); the dynamic loader's search comes next.
	LibDir string
	// BlockSize is the number of tokens per KV block (default 16).
	BlockSize int
	// KVCacheBytes, when > 0, sizes the paged KV cache directly.
	KVCacheBytes int64
	// MemoryFraction is used when KVCacheBytes is 0, like vLLM's
	// gpu_memory_utilization: the cache takes what is left of
	// MemoryFraction × total device memory after the weights, the scratch
	// buffers and whatever else is already in use (default 0.9).
	MemoryFraction float64
	// MaxBlocks, when > 0, caps the number of KV blocks (a huge cache only
	// costs the engine's host-side bookkeeping).
	MaxBlocks int
	// Precision of the GEMMs of steps on the cuBLAS path: "bf16" (default:
	// bf16 weight copies and the GEMMs' input activations rounded to bf16
	// as the kernel before each GEMM writes them, float32 accumulation and
	// output: half the bytes and twice the tensor-core rate; lossless for
	// the weights of a model stored in bf16), "tf32" (float32 storage,
	// TF32 tensor cores, float32 accumulation) or "fp32" (exact float32
	// FMA; for tests).
	Precision string
	// GroupedAttentionFrom: steps of at least this many tokens run the
	// grouped attention kernels (8 lanes of a warp per key: whole K rows
	// per load), smaller ones one key per lane. 0 means
	// DefaultGroupedAttentionFrom, negative never.
	GroupedAttentionFrom int
	// FusedMLP: with Precision "bf16", the MLP's gate/up GEMM and SiLU·up
	// run as one tensor-core kernel (gemm_gu_silu, kernels/gemm.cu) on an
	// interleaved copy of the gate/up weights: the float32 gate/up
	// activations never reach memory and silu_mul is not launched. Needs
	// the hidden size to be a multiple of 32 (New fails otherwise). Takes
	// precedence over GateUpBF16.
	FusedMLP bool
	// FusedQKVNorm: with Precision "bf16", the attention's RMSNorm and
	// [q|k|v] projection run as one tensor-core kernel (gemm_norm, which
	// reads the float32 residual): one rmsnorm launch a layer fewer, and
	// the QKV GEMM is ours instead of cuBLAS's. Needs the hidden size to
	// be a multiple of 32 (New fails otherwise).
	FusedQKVNorm bool
	// FusedMLPNorm is FusedMLP with the MLP's RMSNorm folded into the
	// kernel as well (gemm_gu_silu_norm reads the float32 residual: one
	// rmsnorm launch a layer less). Implies FusedMLP.
	FusedMLPNorm bool
	// GateUpBF16: with Precision "bf16", the MLP's gate/up GEMM writes
	// bf16 instead of float32 and silu_mul16 reads it (half the bytes of
	// the step's widest activation; the gate and up values are rounded to
	// bf16 before SiLU·up, whose product was already rounded to bf16).
	// Needs an MLP size that is a multiple of 8 (New fails otherwise).
	GateUpBF16 bool
	// EagerOnly disables CUDA graphs (see graph.go).
	EagerOnly bool
	// FineGraphBuckets pads a step run as a CUDA graph to finer token
	// buckets (graphBucket): less padding computed, more graphs captured.
	FineGraphBuckets bool
	// GEMVWeights is the weight format of the GEMV path: "auto" (default:
	// bf16 when every weight matrix is exactly representable in bf16, as
	// for a model stored in bf16 like weights/chunlian-base, which makes
	// it lossless; float32 otherwise), "fp32", or "bf16" (rounds float32
	// weights to nearest-even bf16: lossy for such models).
	GEMVWeights string
	// NVRTCTarget is what NVRTC produces for the device: "" or "cubin"
	// (machine code for the exact architecture) or "ptx" (the driver
	// compiles it at load: the way around an NVRTC that fails on a new
	// architecture). See archFor.
	NVRTCTarget string
	// HandoffSpin is how long the CUDA worker polls for the next call, and
	// a caller for its result, before parking (see handoff.go): 0 means
	// DefaultHandoffSpin, negative never polls (plain channel hand-off).
	HandoffSpin time.Duration
	// MaxBatchTokens is the initial size of the activation buffers in
	// tokens (default 8192); they grow on demand when a batch is larger.
	MaxBatchTokens int
}

// DefaultBlockSize is the KV block size when Options.BlockSize is 0: 2
// tokens serve couplets as fast as 4 (and faster than vLLM's 16) and leave
// fewer allocated slots empty; 1-token blocks are slower at high load,
// where the engine's per-block host work is the limit (docs/DECISIONS.md,
// "KV block size").
const DefaultBlockSize = 2

// DefaultGroupedAttentionFrom is Options.GroupedAttentionFrom's default:
// the grouped kernels serve more couplets under load (steps of hundreds of
// tokens), one key per lane is faster for the few tokens of a step at one
// user (docs/DECISIONS.md, "Grouped attention scoring").
const DefaultGroupedAttentionFrom = 64

func (o *Options) defaults() error {
	if o.NVRTCTarget == "" {
		o.NVRTCTarget = testNVRTCTarget
	}
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.MemoryFraction == 0 {
		o.MemoryFraction = 0.9
	}
	if o.Precision == "" {
		o.Precision = "bf16"
	}
	if o.GroupedAttentionFrom == 0 {
		o.GroupedAttentionFrom = DefaultGroupedAttentionFrom
	}
	if o.MaxBatchTokens == 0 {
		o.MaxBatchTokens = 8192
	}
	if o.GEMVWeights == "" {
		o.GEMVWeights = "auto"
	}
	switch {
	case o.BlockSize < 1:
		return fmt.Errorf("cuda: BlockSize %d < 1", o.BlockSize)
	case o.MemoryFraction <= 0 || o.MemoryFraction > 1:
		return fmt.Errorf("cuda: MemoryFraction %g not in (0, 1]", o.MemoryFraction)
	case o.Precision != "tf32" && o.Precision != "fp32" && o.Precision != "bf16":
		return fmt.Errorf("cuda: Precision %q: want tf32, bf16 or fp32", o.Precision)
	case o.NVRTCTarget != "" && o.NVRTCTarget != "cubin" && o.NVRTCTarget != "ptx":
		return fmt.Errorf("cuda: NVRTCTarget %q: want cubin or ptx", o.NVRTCTarget)
	case o.GEMVWeights != "auto" && o.GEMVWeights != "fp32" && o.GEMVWeights != "bf16":
		return fmt.Errorf("cuda: GEMVWeights %q: want auto, fp32 or bf16", o.GEMVWeights)
	case o.KVCacheBytes < 0 || o.MaxBlocks < 0 || o.MaxBatchTokens < 1:
		return errors.New("cuda: negative KVCacheBytes/MaxBlocks or MaxBatchTokens < 1")
	}
	return nil
}

// Info describes the device a Backend runs on.
type Info struct {
	Name            string
	Major, Minor    int // compute capability
	Multiprocessors int
	TotalMemory     int64
	KVCacheBytes    int64
	WeightBytes     int64
	// SmallBatchPath says how steps of at most gemvUpTo tokens run:
	// "gemv-bf16", "gemv-fp32" (the fused GEMV kernels) or "cublas".
	SmallBatchPath       string
	PDL                  bool // programmatic dependent launches in use (compute capability 9.0+)
	NVRTCMajor, NVRTCMin int
	Libraries            []string // paths of driver, NVRTC and cuBLAS as loaded
}

// Backend is forward.Backend on one CUDA device.
//
// Threading: CUDA contexts are per OS thread, so one worker goroutine,
// locked to its OS thread with runtime.LockOSThread, owns the context, the
// stream, the cuBLAS handle and every device buffer, and makes every CUDA
// call. The exported methods send a closure over the cmd channel and wait
// for it; like every forward.Backend they are used by one goroutine at a
// time (the engine loop), and mu makes concurrent misuse safe anyway.
type Backend struct {
	mu     sync.Mutex
	cmd    chan func() // capacity 1: see handoff.go
	spin   time.Duration
	closed bool
	info   Info

	// Everything below is owned by the worker goroutine.
	l      *libs
	cfg    model.Config
	opt    Options
	hd     int // head dim
	qkvDim int // (nH + 2 nKV) * hd
	ctx    uintptr
	dev    int32
	stream uintptr
	blas   uintptr
	module uintptr
	fn     map[string]uintptr
	allocs map[uintptr]bool

	// Weights on the device (float32, HF [out, in] layout).
	embed, lmHead, finalNorm, cosSin uintptr // [V,d], [V,d], [d], [maxPos, hd/2, 2]
	layers                           []devLayer
	maxPos                           int

	// KV cache: one allocation [2L, allocBlocks, blockSize, nKV, hd];
	// layer l's K is slab 2l, its V slab 2l+1.
	cache      uintptr
	numBlocks  int
	blockElems int // blockSize * nKV * hd

	// Activation scratch, sized for capT tokens (rows of logits too).
	capT                  int
	x, h, qkv, attn       uintptr // [T,d], [T,d], [T,qkvDim], [T,nH*hd]
	gu, act, xs, logitBuf uintptr // [T,2ffn], [T,ffn], [T,d], [T,V]
	lseBuf                uintptr // [T] row log-sum-exp
	// in16 is the bf16 GEMM input [T, max(d, nH*hd, ffn)] when bf16GEMM:
	// the normed, attention or SiLU activations the next GEMM reads.
	in16     uintptr
	bf16GEMM bool // Options.Precision "bf16": GEMMs on bf16 copies (gemm16)
	// The optional kernels of the cuBLAS path in use (fusedPaths).
	gu16      bool      // Options.GateUpBF16 (not with fusedMLP)
	fusedMLP  bool      // Options.FusedMLP or FusedMLPNorm
	fusedNorm bool      // Options.FusedMLPNorm
	fusedQKV  bool      // Options.FusedQKVNorm
	lseHost   []float32 // [R] of the last Forward
	meta      uintptr   // int32 step metadata, capMeta entries
	capMeta   int
	hostMeta  []int32 // host copy, reused

	// Device draws (draw.go): the registered allowed-token masks
	// [maxMasks, maskWords] uint64 (allocated by the first RegisterMask),
	// draw_rows' output [capDraws, 2] int32, the gathered host rows
	// [capGather, V], and the host packing scratch of the draw specs.
	masks, drawOut, gatherBuf   uintptr
	nMasks, capDraws, capGather int
	drawMeta                    []int32

	// LaunchDraw/WaitDraw's slots (async.go), and how WaitDraw saw its
	// launches done: by the done word, or by the worker's event sync
	// (caller side, under mu).
	slots                [asyncSlots]asyncSlot
	fastWaits, slowWaits int64
	noPoll               bool // tests: never poll the done word (always the fallback)
	// deferred: errors of CopyBlocks' enqueueing (written by the worker
	// after CopyBlocks returned; errMu guards it).
	errMu    sync.Mutex
	deferred error

	// pinned is the caller's logits buffer, page-locked with
	// cuMemHostRegister so the logits copy runs at full DMA speed; it is
	// referenced here so the GC cannot free it while registered. pinAddr
	// and pinBytes describe the registered range.
	pinned            []float32
	pinAddr, pinBytes uintptr
	pinFailed         bool

	// CUDA graphs (graph.go).
	graphsOn                            bool
	graphs                              map[graphKey]uintptr // → CUgraphExec
	graphLaunches, captures, eagerSteps int64
	graphErr                            error
	padBuf                              []int32
	workspace                           uintptr // cuBLAS workspace (no allocation during capture)
	allocBlocks                         int     // numBlocks + 1 reserved padding block

	// gemvOK: the model's shapes suit the small-batch GEMV kernels (every
	// K a multiple of 4, gemvMaxM rows of the widest K fit 48 KiB of
	// shared memory); set in init. gemvBF: they read the bf16 copies of
	// the weights (devLayer.*BF, lmHeadBF; set in uploadWeights).
	gemvOK, gemvBF bool
	lmHeadBF       uintptr // [V, d] bf16, when gemvBF or bf16GEMM

	computeType uintptr
	one, zero   *float32 // host scalars for cuBLAS (heap: stable address)
	args        *launchArgs
	pdl         bool       // programmatic dependent launches supported (set in init)
	pdlCfg      *launchCfg // cuLaunchKernelEx's config, reused (heap: stable address)
}

// devLayer is one decoder layer's device weights.
type devLayer struct {
	attnNorm, wqkv, wo uintptr // [d], [qkvDim, d], [d, nH*hd]
	mlpNorm, wgu, down uintptr // [d], [2ffn, d], [d, ffn]
	// bf16 copies of the four matrices for the GEMV path and the bf16
	// GEMMs (0 unless gemvBF or bf16GEMM).
	wqkvBF, woBF, wguBF, downBF uintptr
	// wguIL: the gate and up rows interleaved (gate 0, up 0, gate 1, …)
	// in bf16 for gemm_gu_silu (0 unless fusedMLP).
	wguIL uintptr
}

// launchArgs holds kernel parameters for cuLaunchKernel: ptrs[i] points at
// vals[i]. It lives on the heap (never moved) and is reused; the driver
// copies the values at launch.
type launchArgs struct {
	vals [16]uint64
	ptrs [16]uintptr
}

var (
	_ forward.Backend       = (*Backend)(nil)
	_ forward.RowLSEBackend = (*Backend)(nil) // the engine reads LogSumExp instead of a host pass
	_ forward.DrawBackend   = (*Backend)(nil) // ForwardDraw: draw.go
)

// Info returns the device description.
func (b *Backend) Info() Info { return b.info }

func (b *Backend) sync() error {
	d := &b.l.drv
	return d.call("cuStreamSynchronize", d.cuStreamSynchronize, b.stream)
}

// kvSlab returns the device address of layer l's K (v=0) or V (v=1) cache.
func (b *Backend) kvSlab(l, v int) uintptr {
	return b.cache + uintptr(int64(2*l+v)*int64(b.allocBlocks)*int64(b.blockElems)*4)
}

// launch starts kernel name with a 1-D block and a (gx, gy) grid. Each
// argument is passed as 8 bytes: pointers and int64 as is, int32 in the
// low half (little-endian), float32 as its bits (use f32).
func (b *Backend) launch(name string, gx, gy, block int, args ...uint64) error {
	return b.launchShm(name, gx, gy, block, 0, args...)
}

// launchShm is launch with shm bytes of dynamic shared memory.
func (b *Backend) launchShm(name string, gx, gy, block, shm int, args ...uint64) error {
	a := b.args
	for i, v := range args {
		a.vals[i] = v
		a.ptrs[i] = uintptr(unsafe.Pointer(&a.vals[i]))
	}
	d := &b.l.drv
	r := sc(d.cuLaunchKernel, b.fn[name], uintptr(gx), uintptr(gy), 1, uintptr(block), 1, 1, uintptr(shm), b.stream,
		uintptr(unsafe.Pointer(&a.ptrs[0])), 0)
	return d.cuErr("launch "+name, r)
}

// launchCfg is cuda.h's CUlaunchConfig (56 bytes: seven uints, padding,
// the stream, the attribute pointer, their count) with room for its one
// attribute, CUlaunchAttribute (id, padding, a 64-byte value union).
type launchCfg struct {
	gridX, gridY, gridZ, blockX, blockY, blockZ, shm uint32
	_                                                uint32
	stream, attrs                                    uintptr
	numAttrs                                         uint32
	_                                                uint32
	attr                                             struct {
		id  uint32
		_   uint32
		val [16]uint32
	}
}

// cuLaunchAttributeProgrammaticStreamSerialization: cuda.h
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
const cuLaunchAttributeProgrammaticStreamSerialization = 6

// launchPDL is launchShm with the programmatic-stream-serialization
// attribute when b.pdl: the kernel may start before its predecessor on the
// stream finishes and must call pdl_wait (kernels/llama.cu) before reading
// anything the predecessor writes and before writing anything. Only for
// kernels launched right after another kernel of ours (which trigger their
// dependents only after their own wait).
func (b *Backend) launchPDL(name string, gx, gy, block, shm int, args ...uint64) error {
	if !b.pdl {
		return b.launchShm(name, gx, gy, block, shm, args...)
	}
	a := b.args
	for i, v := range args {
		a.vals[i] = v
		a.ptrs[i] = uintptr(unsafe.Pointer(&a.vals[i]))
	}
	c := b.pdlCfg
	*c = launchCfg{gridX: uint32(gx), gridY: uint32(gy), gridZ: 1, blockX: uint32(block), blockY: 1, blockZ: 1,
		shm: uint32(shm), stream: b.stream, numAttrs: 1}
	c.attrs = uintptr(unsafe.Pointer(&c.attr))
	c.attr.id = cuLaunchAttributeProgrammaticStreamSerialization
	c.attr.val[0] = 1
	d := &b.l.drv
	r := sc(d.cuLaunchKernelEx, uintptr(unsafe.Pointer(c)), b.fn[name], uintptr(unsafe.Pointer(&a.ptrs[0])), 0)
	return d.cuErr("launch (PDL) "+name, r)
}

func f32(x float32) uint64 { return uint64(math.Float32bits(x)) }

// i32 passes a Go int as a C int (low 32 bits; sign kept in two's complement).
func i32(x int) uint64 { return uint64(uint32(int32(x))) }

// dptr passes a device pointer as a kernel argument.
func dptr(p uintptr) uint64 { return uint64(p) }

// gemm computes the row-major y[M,N] = x[M,K] · W[N,K]ᵀ + beta·y.
// cuBLAS is column-major, so this is yᶜ[N,M] = Wᶜᵀ · xᶜ with W as the
// transposed operand.
func (b *Backend) gemm(y, x, w uintptr, M, N, K int, accumulate bool) error {
	beta := b.zero
	if accumulate {
		beta = b.one
	}
	bl := &b.l.blas
	r := sc(bl.gemmEx, b.blas, cublasOpT, cublasOpN, uintptr(N), uintptr(M), uintptr(K),
		uintptr(unsafe.Pointer(b.one)), w, cudaR32F, uintptr(K), x, cudaR32F, uintptr(K),
		uintptr(unsafe.Pointer(beta)), y, cudaR32F, uintptr(N), b.computeType, uintptr(uint32(0xffffffff)))
	return bl.err(fmt.Sprintf("gemmEx(M=%d,N=%d,K=%d)", M, N, K), r)
}

// gemm16 is gemm with bf16 inputs: y[M,N] (float32) = x16[M,K] ·
// w16[N,K]ᵀ + beta·y, accumulated in float32.
func (b *Backend) gemm16(y, x16, w16 uintptr, M, N, K int, accumulate bool) error {
	beta := b.zero
	if accumulate {
		beta = b.one
	}
	bl := &b.l.blas
	r := sc(bl.gemmEx, b.blas, cublasOpT, cublasOpN, uintptr(N), uintptr(M), uintptr(K),
		uintptr(unsafe.Pointer(b.one)), w16, cudaR16BF, uintptr(K), x16, cudaR16BF, uintptr(K),
		uintptr(unsafe.Pointer(beta)), y, cudaR32F, uintptr(N), cublasCompute32F, uintptr(uint32(0xffffffff)))
	return bl.err(fmt.Sprintf("gemmEx bf16(M=%d,N=%d,K=%d)", M, N, K), r)
}

// gemm16to16 is gemm16 with a bf16 output: y16[M,N] = bf16(x16[M,K] ·
// w16[N,K]ᵀ), accumulated in float32 and rounded once.
func (b *Backend) gemm16to16(y16, x16, w16 uintptr, M, N, K int) error {
	bl := &b.l.blas
	r := sc(bl.gemmEx, b.blas, cublasOpT, cublasOpN, uintptr(N), uintptr(M), uintptr(K),
		uintptr(unsafe.Pointer(b.one)), w16, cudaR16BF, uintptr(K), x16, cudaR16BF, uintptr(K),
		uintptr(unsafe.Pointer(b.zero)), y16, cudaR16BF, uintptr(N), cublasCompute32F, uintptr(uint32(0xffffffff)))
	return bl.err(fmt.Sprintf("gemmEx bf16→bf16(M=%d,N=%d,K=%d)", M, N, K), r)
}

// qkvProj enqueues the attention's input for T tokens: RMSNorm of the
// residual rows, then the fused [q|k|v] projection into qkv with mm on
// in (h, or in16 with bf16GEMM); with fusedQKV one gemm_norm launch
// that normalises the residual rows itself.
func (b *Backend) qkvProj(T int, L *devLayer, wqkv uintptr, mm func(y, x, w uintptr, M, N, K int, acc bool) error, in uintptr, in16 uint64) error {
	dm := b.cfg.HiddenSize
	if b.fusedQKV {
		gx, gy := tcGrid(T, b.qkvDim)
		return b.launch("gemm_norm", gx, gy, tcThreads, dptr(b.qkv), dptr(b.x), dptr(L.attnNorm),
			f32(float32(b.cfg.RMSNormEps)), dptr(L.wqkvBF), i32(T), i32(dm), i32(b.qkvDim))
	}
	return errors.Join(
		b.rmsnorm(b.h, b.x, L.attnNorm, 0, T, in16),
		mm(b.qkv, in, wqkv, T, b.qkvDim, dm, false),
	)
}

// mlpUp enqueues the MLP's first half for T tokens: RMSNorm of the
// residual rows, the gate/up GEMM and SiLU·up. It returns where it left
// the activation the down GEMM reads: act, or with bf16GEMM in16 (gu with
// fusedMLP: gemm_gu_silu reads in16 while it writes; gemm_gu_silu_norm
// reads the residual itself). With gu16 the GEMM writes bf16 into gu and
// silu_mul16 reads it.
func (b *Backend) mlpUp(T int, L *devLayer, in16 uint64) (uintptr, error) {
	dm, ffn := b.cfg.HiddenSize, b.cfg.IntermediateSize
	gx, gy := tcGrid(T, 2*ffn)
	if b.fusedNorm {
		return b.gu, b.launch("gemm_gu_silu_norm", gx, gy, tcThreads,
			dptr(b.gu), dptr(b.x), dptr(L.mlpNorm), f32(float32(b.cfg.RMSNormEps)), dptr(L.wguIL), i32(T), i32(dm), i32(2*ffn))
	}
	if err := b.rmsnorm(b.h, b.x, L.mlpNorm, 0, T, in16); err != nil {
		return 0, err
	}
	switch {
	case b.fusedMLP:
		return b.gu, b.launch("gemm_gu_silu", gx, gy, tcThreads,
			dptr(b.gu), in16, dptr(L.wguIL), i32(T), i32(dm), i32(2*ffn))
	case b.gu16:
		n8 := T * ffn / 8
		return b.in16, errors.Join(
			b.gemm16to16(b.gu, b.in16, L.wguBF, T, 2*ffn, dm),
			b.launch("silu_mul16", max(1, min((n8+255)/256, 4096)), 1, 256, in16, dptr(b.gu), i32(T), i32(ffn)),
		)
	}
	mm, x, wgu, act := b.gemm, b.h, L.wgu, b.act
	if b.bf16GEMM { // silu_mul writes in16 (its out16) instead of act
		mm, x, wgu, act = b.gemm16, b.in16, L.wguBF, b.in16
	}
	return act, errors.Join(
		mm(b.gu, x, wgu, T, 2*ffn, dm, false),
		b.launch("silu_mul", min((T*ffn+255)/256, 4096), 1, 256, dptr(b.act), dptr(b.gu), i32(T), i32(ffn), in16),
	)
}

// The tensor-core GEMMs' tile (TC_BM, TC_BN, TC_BK and TC_THREADS in
// kernels/gemm.cu).
const (
	tcBM, tcBN, tcBK = 64, 128, 32
	tcThreads        = 256
)

// tcGrid is the tensor-core GEMMs' grid for M rows and N columns.
func tcGrid(M, N int) (int, int) { return (M + tcBM - 1) / tcBM, (N + tcBN - 1) / tcBN }

// LogSumExp returns, for each logits row of the last Forward, log Σ exp of
// the row, computed on the GPU. A
// row's log-probability of token t is logits[t] − LogSumExp()[row]. The
// slice is reused by the next Forward; call it from the goroutine that
// called Forward. ForwardDraw sets it too; LaunchDraw/WaitDraw leave it
// as it was (WaitDraw returns the launch's log-sum-exps itself).
func (b *Backend) LogSumExp() []float32 {
	return b.lseHost
}

// NumBlocks implements forward.Backend.
func (b *Backend) NumBlocks() int { return b.numBlocks }

// BlockSize implements forward.Backend.
func (b *Backend) BlockSize() int { return b.opt.BlockSize }

// VocabSize implements forward.Backend.
func (b *Backend) VocabSize() int { return b.cfg.VocabSize }

// Forward implements forward.Backend.
func (b *Backend) Forward(bt *forward.Batch, logits []float32) error {
	return b.syncCall(func() error { return b.forward(bt, logits) })
}

// prepare validates bt and packs its metadata into hostMeta:
// tokens [T] | positions [T] | slots [T] | tokSeq [T] | rows [R] |
// blockTables [S, stride]. It returns the offsets (in int32s) and stride.
func (b *Backend) prepare(bt *forward.Batch, logits []float32) (off [6]int, stride int, err error) {
	if R, V := len(bt.LogitRows), b.cfg.VocabSize; len(logits) < R*V {
		return off, 0, fmt.Errorf("cuda: logits buffer %d < %d rows × %d", len(logits), R, V)
	}
	return b.prepareMeta(bt)
}

// prepareMeta is prepare without the logits buffer's check (ForwardDraw
// checks it against its host rows).
func (b *Backend) prepareMeta(bt *forward.Batch) (off [6]int, stride int, err error) {
	T, R, S := len(bt.Tokens), len(bt.LogitRows), len(bt.Seqs)
	V, bs := b.cfg.VocabSize, b.opt.BlockSize
	if T == 0 {
		return off, 0, errors.New("cuda: empty batch")
	}
	if len(bt.Positions) != T || len(bt.SlotMapping) != T {
		return off, 0, fmt.Errorf("cuda: batch has %d tokens, %d positions, %d slots", T, len(bt.Positions), len(bt.SlotMapping))
	}
	for _, s := range bt.Seqs {
		stride = max(stride, len(s.BlockTable))
	}
	stride = max(stride, 1)
	off[0], off[1], off[2], off[3], off[4] = 0, T, 2*T, 3*T, 4*T
	off[5] = 4*T + R
	n := off[5] + S*stride
	if cap(b.hostMeta) < n {
		b.hostMeta = make([]int32, n, n+n/2)
	}
	h := b.hostMeta[:n]
	copy(h[off[0]:], bt.Tokens)
	copy(h[off[1]:], bt.Positions)
	copy(h[off[2]:], bt.SlotMapping)
	nSlots := int64(b.numBlocks) * int64(bs)
	for i := 0; i < T; i++ {
		if t := bt.Tokens[i]; t < 0 || int(t) >= V {
			return off, 0, fmt.Errorf("cuda: token %d out of vocabulary [0,%d)", t, V)
		}
		if p := bt.Positions[i]; p < 0 || int(p) >= b.maxPos {
			return off, 0, fmt.Errorf("cuda: position %d out of [0,%d)", p, b.maxPos)
		}
		if s := bt.SlotMapping[i]; s < 0 || int64(s) >= nSlots {
			return off, 0, fmt.Errorf("cuda: slot %d out of [0,%d)", s, nSlots)
		}
		h[off[3]+i] = -1
	}
	for si, s := range bt.Seqs {
		if s.Len < 1 || s.Start < 0 || s.Start+s.Len > T {
			return off, 0, fmt.Errorf("cuda: sequence %d spans [%d,%d) of %d tokens", si, s.Start, s.Start+s.Len, T)
		}
		row := h[off[5]+si*stride : off[5]+(si+1)*stride]
		for i := range row {
			row[i] = 0
		}
		copy(row, s.BlockTable)
		for i := s.Start; i < s.Start+s.Len; i++ {
			if h[off[3]+i] != -1 {
				return off, 0, fmt.Errorf("cuda: token %d belongs to two sequences", i)
			}
			h[off[3]+i] = int32(si)
			// Attention reads keys 0..pos through the block table.
			if need := int(bt.Positions[i])/bs + 1; need > len(s.BlockTable) {
				return off, 0, fmt.Errorf("cuda: sequence %d position %d needs %d blocks, table has %d", si, bt.Positions[i], need, len(s.BlockTable))
			}
		}
		need := 0
		for i := s.Start; i < s.Start+s.Len; i++ {
			need = max(need, int(bt.Positions[i])/bs+1)
		}
		for _, blk := range s.BlockTable[:need] {
			if blk < 0 || int(blk) >= b.numBlocks {
				return off, 0, fmt.Errorf("cuda: sequence %d block %d out of [0,%d)", si, blk, b.numBlocks)
			}
		}
	}
	for i := 0; i < T; i++ {
		if h[off[3]+i] == -1 {
			return off, 0, fmt.Errorf("cuda: token %d is in no sequence", i)
		}
	}
	for i, r := range bt.LogitRows {
		if r < 0 || r >= T {
			return off, 0, fmt.Errorf("cuda: logit row %d out of [0,%d)", r, T)
		}
		h[off[4]+i] = int32(r)
	}
	return off, stride, nil
}

func (b *Backend) forward(bt *forward.Batch, logits []float32) error {
	if err := b.asyncIdle("Forward"); err != nil {
		return err
	}
	off, stride, err := b.prepare(bt, logits)
	if err != nil {
		return err
	}
	R := len(bt.LogitRows)
	meta, off, tp := b.stepMeta(bt, off, stride)
	errs := b.run(meta, 0, off, len(bt.Tokens), R, stride, tp)
	d := &b.l.drv
	if errs == nil && R > 0 {
		b.pin(logits)
		errs = d.call("cuMemcpyDtoHAsync(logits)", d.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&logits[0])), b.logitBuf, uintptr(R*b.cfg.VocabSize*4), b.stream)
	}
	errs = b.copyLSE(errs, R)
	if err := b.sync(); err != nil {
		return errors.Join(errs, err)
	}
	runtime.KeepAlive(logits)
	return errs
}

// stepMeta returns the metadata of the step prepare packed (offsets off):
// hostMeta as it is, or padded to the graph bucket tp > 0 when the step
// runs as a CUDA graph (tp = 0: eager).
func (b *Backend) stepMeta(bt *forward.Batch, off [6]int, stride int) ([]int32, [6]int, int) {
	T, R, S := len(bt.Tokens), len(bt.LogitRows), len(bt.Seqs)
	meta := b.hostMeta[:off[5]+S*stride]
	tp := 0
	if b.graphsOn {
		tp = graphBucket(T, b.opt.FineGraphBuckets)
	}
	if tp > 0 {
		meta, off = b.padMeta(off, T, R, S, stride, tp)
	}
	return meta, off, tp
}

// run copies meta to the device and enqueues the forward pass of T tokens
// and R logits rows (as the graph for bucket tp > 0, else eagerly). The
// kernels read the metadata at the offsets off; anything after them in
// meta travels in the same copy. src, when not 0, is a page-locked copy
// of meta to copy from instead (LaunchDraw's staging: a truly
// asynchronous copy, which the caller keeps intact until the stream has
// passed it).
func (b *Backend) run(meta []int32, src uintptr, off [6]int, T, R, stride, tp int) error {
	Te, Re := T, R // shapes the kernels run at
	if tp > 0 {
		Te, Re = tp, tp
	}
	if err := b.growScratch(max(Te, Re)); err != nil {
		return err
	}
	if err := b.ensureMeta(len(meta)); err != nil {
		return err
	}
	d := &b.l.drv
	// Pageable source: the driver stages it before returning, so the host
	// buffer may be rewritten by the next step.
	if src == 0 {
		src = uintptr(unsafe.Pointer(&meta[0]))
	}
	if err := d.call("cuMemcpyHtoDAsync(meta)", d.cuMemcpyHtoDAsync, b.meta, src, uintptr(len(meta)*4), b.stream); err != nil {
		return err
	}
	if tp > 0 {
		return b.launchGraph(tp, stride, off)
	}
	b.eagerSteps++
	return b.enqueue(Te, Re, stride, off)
}

// copyLSE enqueues the copy of the R rows' log-sum-exp into lseHost (when
// errs is nil) and returns errs joined with its
// error; lseHost is empty otherwise.
func (b *Backend) copyLSE(errs error, R int) error {
	b.lseHost = b.lseHost[:0]
	if errs == nil && R > 0 {
		if cap(b.lseHost) < R {
			b.lseHost = make([]float32, R, 2*R)
		}
		b.lseHost = b.lseHost[:R]
		d := &b.l.drv
		errs = d.call("cuMemcpyDtoHAsync(lse)", d.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&b.lseHost[0])), b.lseBuf, uintptr(R*4), b.stream)
	}
	return errs
}

// enqueue launches the whole forward pass for T tokens (R logits rows) on
// the stream; the metadata is already on the device at b.meta with the
// given offsets (see prepare). Every pointer and size it passes is fixed
// for a given (T, R, stride) as long as no buffer is reallocated, which
// is what makes the sequence capturable as a CUDA graph.
func (b *Backend) enqueue(T, R, stride int, off [6]int) error {
	mp := func(i int) uint64 { return uint64(b.meta + uintptr(off[i]*4)) }
	tokens, positions, slots, tokSeq, rows, tables := mp(0), mp(1), mp(2), mp(3), mp(4), mp(5)
	c := b.cfg
	dm, ffn, nH := c.HiddenSize, c.IntermediateSize, c.NumHeads
	if b.useGEMV(T) {
		return b.enqueueSmall(T, R, stride, off)
	}
	// Each GEMM reads the activation the kernel before it wrote: float32
	// in h, attn, act or xs, or with bf16GEMM bf16 in in16 (a = 0 there:
	// the kernels then write in16 instead) against the bf16 weights.
	in16, mm := uint64(0), b.gemm
	if b.bf16GEMM {
		in16, mm = dptr(b.in16), b.gemm16
	}
	a := func(p uintptr) uintptr {
		if b.bf16GEMM {
			return b.in16
		}
		return p
	}
	lmHead := b.lmHead
	if b.bf16GEMM {
		lmHead = b.lmHeadBF
	}
	errs := b.launch("embed_gather", T, 1, 128, dptr(b.x), dptr(b.embed), tokens, i32(dm))
	for l, L := range b.layers {
		if errs != nil {
			return errs
		}
		kc, vc := b.kvSlab(l, 0), b.kvSlab(l, 1)
		wqkv, wo, down := L.wqkv, L.wo, L.down
		if b.bf16GEMM {
			wqkv, wo, down = L.wqkvBF, L.woBF, L.downBF
		}
		errs = errors.Join(
			b.qkvProj(T, &L, wqkv, mm, a(b.h), in16),
			b.attention(T, stride, kc, vc, positions, slots, tokSeq, tables, in16),
			mm(b.x, a(b.attn), wo, T, dm, nH*b.hd, true),
		)
		if errs == nil {
			act, err := b.mlpUp(T, &L, in16)
			errs = errors.Join(err, mm(b.x, act, down, T, dm, ffn, true))
		}
	}
	if errs == nil && R > 0 {
		errs = errors.Join(
			b.rmsnorm(b.xs, b.x, b.finalNorm, rows, R, in16),
			mm(b.logitBuf, a(b.xs), lmHead, R, c.VocabSize, dm, false),
		)
		if errs == nil {
			errs = b.launch("row_lse", R, 1, rowLSEThreads, dptr(b.lseBuf), dptr(b.logitBuf), i32(c.VocabSize))
		}
	}
	return errs
}

// attention enqueues one layer's RoPE, K/V cache store and attention for
// T tokens on the cuBLAS path in one launch (paged_attention_rope: the QKV
// GEMM's output is not rotated). kc, vc are the layer's caches; the
// metadata pointers are enqueue's.
func (b *Backend) attention(T, stride int, kc, vc uintptr, positions, slots, tokSeq, tables, in16 uint64) error {
	nH, nKV := b.cfg.NumHeads, b.cfg.NumKVHeads
	scale := float32(1 / math.Sqrt(float64(b.hd)))
	// After gemm_norm, a kernel of ours, attention may launch early
	// (programmatic dependent launch); after cuBLAS it may not.
	launch := b.launchShm
	if b.fusedQKV {
		launch = b.launchPDL
	}
	return launch(b.attnKernel("paged_attention_rope", T), (T*nH+3)/4, 1, 128, 0, dptr(b.attn), dptr(b.qkv), dptr(b.cosSin), slots,
		dptr(kc), dptr(vc), tokSeq, positions, tables, i32(stride), i32(T), i32(nH), i32(nKV),
		i32(b.opt.BlockSize), f32(scale), in16)
}

// attnKernel names the attention kernel (paged_attention_rope or
// paged_attention_chunked) for a step of T tokens: the grouped one (_g)
// from Options.GroupedAttentionFrom tokens on.
func (b *Backend) attnKernel(name string, T int) string {
	if g := b.opt.GroupedAttentionFrom; g < 0 || T < g {
		return name
	}
	switch name {
	case "paged_attention_rope":
		return "paged_attention_rope_g"
	case "paged_attention_chunked":
		return "paged_attention_chunked_g"
	}
	panic("cuda: no grouped attention kernel for " + name)
}

// rmsnormRowsPerBlock: the rmsnorm kernel normalises a row per warp, 8
// warps to a block of 256 threads.
const rmsnormRowsPerBlock = 8

// rmsnorm enqueues out[r] = RMSNorm(x[rows ? rows[r] : r]) · w for n rows
// (rows: a device pointer to n row indices, or 0), written as bf16 into
// out16 instead when out16 is not 0.
func (b *Backend) rmsnorm(out, x, w uintptr, rows uint64, n int, out16 uint64) error {
	return b.launch("rmsnorm", (n+rmsnormRowsPerBlock-1)/rmsnormRowsPerBlock, 1, 32*rmsnormRowsPerBlock,
		uint64(out), uint64(x), uint64(w), rows, i32(b.cfg.HiddenSize), f32(float32(b.cfg.RMSNormEps)), i32(n), out16)
}

// pinMinBytes: smaller logits buffers are copied pageable (registration
// costs more than it saves, and small Go objects may share pages).
const pinMinBytes = 1 << 20

// pin page-locks the whole capacity of logits (the engine reuses one
// buffer across steps, so this happens once per buffer). A failure only
// means the slower pageable copy; it is not retried.
func (b *Backend) pin(logits []float32) {
	if b.pinFailed || cap(logits)*4 < pinMinBytes {
		return
	}
	full := logits[:cap(logits)]
	addr, bytes := uintptr(unsafe.Pointer(&full[0])), uintptr(len(full)*4)
	if b.pinned != nil && addr >= b.pinAddr && addr+uintptr(len(logits)*4) <= b.pinAddr+b.pinBytes {
		return
	}
	b.unpin()
	d := &b.l.drv
	if err := d.call("cuMemHostRegister", d.cuMemHostRegister, addr, bytes, 0); err != nil {
		b.pinFailed = true
		return
	}
	b.pinned, b.pinAddr, b.pinBytes = full, addr, bytes
}

func (b *Backend) unpin() {
	if b.pinned == nil {
		return
	}
	d := &b.l.drv
	_ = d.call("cuMemHostUnregister", d.cuMemHostUnregister, b.pinAddr)
	b.pinned, b.pinAddr, b.pinBytes = nil, 0, 0
}

// CopyBlocks implements forward.Backend: the first slots[i] slots of block
// src[i] → dst[i] in every layer's K and V cache. Only the pairs'
// validation waits: the copy is handed to the worker, which enqueues it in
// call order (after any launched step, before the next), and an error in
// enqueueing it comes back from the next call that reports errors
// (deferredErr).
func (b *Backend) CopyBlocks(src, dst, slots []int32) error {
	if len(src) != len(dst) || len(src) != len(slots) {
		return fmt.Errorf("cuda: CopyBlocks with %d sources, %d destinations and %d slot counts", len(src), len(dst), len(slots))
	}
	if len(src) == 0 {
		return nil
	}
	for i := range src {
		if src[i] < 0 || int(src[i]) >= b.numBlocks || dst[i] < 0 || int(dst[i]) >= b.numBlocks {
			return fmt.Errorf("cuda: CopyBlocks pair %d→%d out of [0,%d)", src[i], dst[i], b.numBlocks)
		}
		if slots[i] < 1 || int(slots[i]) > b.opt.BlockSize {
			return fmt.Errorf("cuda: CopyBlocks of %d slots of a %d-slot block", slots[i], b.opt.BlockSize)
		}
	}
	if err := b.lockCall(); err != nil {
		return err
	}
	defer b.mu.Unlock()
	// The worker owns h from here (the caller may reuse the slices).
	n := len(src)
	h := make([]int32, 0, 3*n)
	h = append(append(append(h, src...), dst...), slots...)
	b.cmd <- func() {
		if err := b.copyBlocks(h); err != nil {
			b.deferErr(fmt.Errorf("cuda: CopyBlocks (enqueued earlier): %w", err))
		}
	}
	return nil
}

// copyBlocks is CopyBlocks on the worker: h is src, dst, then slots.
func (b *Backend) copyBlocks(h []int32) error {
	n := len(h) / 3
	if err := b.ensureMeta(3 * n); err != nil {
		return err
	}
	d := &b.l.drv
	// No stream sync: the pageable pairs are staged by the driver before
	// the copy returns (as run's metadata), and the kernel is ordered on
	// the stream after any launched step and before the next one, so a
	// CopyBlocks between LaunchDraw and WaitDraw does not wait for the
	// launch. (ensureMeta syncs if it has to grow b.meta.)
	err := d.call("cuMemcpyHtoDAsync(pairs)", d.cuMemcpyHtoDAsync, b.meta, uintptr(unsafe.Pointer(&h[0])), uintptr(3*n*4), b.stream)
	runtime.KeepAlive(h)
	if err != nil {
		return err
	}
	slotElems := b.blockElems / b.opt.BlockSize
	return b.launch("copy_blocks", n, 2*b.cfg.NumLayers, 256, uint64(b.cache), uint64(b.meta), uint64(b.meta+uintptr(n*4)),
		uint64(b.meta+uintptr(2*n*4)), uint64(b.allocBlocks), i32(b.blockElems), i32(slotElems))
}

// deferErr keeps an error of work the worker did after its caller had
// returned (CopyBlocks), for deferredErr.
func (b *Backend) deferErr(err error) {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	b.deferred = errors.Join(b.deferred, err)
}

// deferredErr returns and clears the kept errors: Forward, ForwardDraw,
// CopyBlocks and WaitDraw report them before doing anything.
func (b *Backend) deferredErr() error {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	err := b.deferred
	b.deferred = nil
	return err
}
