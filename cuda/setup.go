package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"chunlian/model"
	"github.com/ebitengine/purego"
)

// New uploads m to the GPU, compiles the kernels for the device and
// allocates the paged KV cache. The error names what is missing when the
// CUDA libraries or a device are absent.
func New(m *model.Model, o Options) (*Backend, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	l, err := loadLibs(o.LibDir)
	if err != nil {
		return nil, err
	}
	b := &Backend{cmd: make(chan func(), 1), spin: handoffSpin(o.HandoffSpin), l: l, opt: o, fn: map[string]uintptr{},
		allocs: map[uintptr]bool{}, graphs: map[graphKey]uintptr{}, one: new(float32), zero: new(float32), args: &launchArgs{}, pdlCfg: &launchCfg{}}
	*b.one = 1
	go b.worker()
	err = b.do(func() error { return b.init(m) })
	if err != nil {
		b.do(func() error { b.release(); return nil })
		close(b.cmd)
		return nil, err
	}
	fixSignalStacks() // the driver, cuBLAS and NVRTC are loaded and initialised
	return b, nil
}

// init sets b up for m on device b.opt.Device: context, stream, kernels,
// cuBLAS, weights, scratch buffers and the KV cache.
func (b *Backend) init(m *model.Model) error {
	d := &b.l.drv
	c := m.Config
	b.cfg = c
	b.hd = c.HeadDim
	if b.hd == 0 {
		b.hd = c.HiddenSize / c.NumHeads
	}
	if b.hd%2 != 0 || c.NumKVHeads < 1 || c.NumHeads%c.NumKVHeads != 0 {
		return fmt.Errorf("cuda: unsupported config: head dim %d, %d heads, %d kv heads", b.hd, c.NumHeads, c.NumKVHeads)
	}
	b.qkvDim = (c.NumHeads + 2*c.NumKVHeads) * b.hd
	b.maxPos = c.MaxPositions
	if b.maxPos <= 0 {
		b.maxPos = 2048
	}
	if err := d.call("cuInit", d.cuInit, 0); err != nil {
		return err
	}
	if err := d.call("cuDeviceGet", d.cuDeviceGet, uintptr(unsafe.Pointer(&b.dev)), uintptr(b.opt.Device)); err != nil {
		return err
	}
	if err := b.queryDevice(); err != nil {
		return err
	}
	if err := d.call("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&b.ctx)), uintptr(b.dev)); err != nil {
		return err
	}
	if err := d.call("cuCtxSetCurrent", d.cuCtxSetCurrent, b.ctx); err != nil {
		return err
	}
	// Non-blocking stream: no implicit sync with the legacy default stream.
	if err := d.call("cuStreamCreate", d.cuStreamCreate, uintptr(unsafe.Pointer(&b.stream)), 1); err != nil {
		return err
	}

	if err := b.loadKernels(); err != nil {
		return err
	}
	if err := b.initBLAS(); err != nil {
		return err
	}
	b.graphsOn = !b.opt.EagerOnly && b.l.drv.cuGraphLaunch != 0
	b.gemvOK = gemvShapesOK(c.HiddenSize, c.IntermediateSize, c.NumHeads*b.hd)
	b.pdl = b.info.Major >= 9 && b.l.drv.cuLaunchKernelEx != 0
	b.info.PDL = b.pdl

	if err := b.uploadWeights(m); err != nil {
		return err
	}
	switch {
	case !b.gemvOK:
		b.info.SmallBatchPath = "cublas"
	case b.gemvBF:
		b.info.SmallBatchPath = "gemv-bf16"
	default:
		b.info.SmallBatchPath = "gemv-fp32"
	}
	if err := b.growScratch(b.opt.MaxBatchTokens); err != nil {
		return err
	}
	if err := b.allocCache(); err != nil {
		return err
	}
	return b.sync()
}

// queryDevice fills b.info from the device's attributes.
func (b *Backend) queryDevice() error {
	d := &b.l.drv
	attr := func(a int) (int, error) {
		var v int32
		err := d.call("cuDeviceGetAttribute", d.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(b.dev))
		return int(v), err
	}
	var err error
	if b.info.Major, err = attr(attrComputeCapabilityMajr); err != nil {
		return err
	}
	if b.info.Minor, err = attr(attrComputeCapabilityMinr); err != nil {
		return err
	}
	if b.info.Multiprocessors, err = attr(attrMultiprocessorCount); err != nil {
		return err
	}
	name := make([]byte, 256)
	if err := d.call("cuDeviceGetName", d.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), 256, uintptr(b.dev)); err != nil {
		return err
	}
	for i, ch := range name {
		if ch == 0 {
			name = name[:i]
			break
		}
	}
	b.info.Name = string(name)
	var total uint64
	if err := d.call("cuDeviceTotalMem", d.cuDeviceTotalMem, uintptr(unsafe.Pointer(&total)), uintptr(b.dev)); err != nil {
		return err
	}
	b.info.TotalMemory = int64(total)
	b.info.Libraries = []string{b.l.driverPath, b.l.nvrtcPath, b.l.cublasPath}
	b.info.NVRTCMajor, b.info.NVRTCMin = b.l.rtc.Version()

	return nil
}

// loadKernels compiles the kernels for the device's architecture (NVRTC
// to CUBIN, cached) and loads their functions into b.fn.
func (b *Backend) loadKernels() error {
	d := &b.l.drv
	res, err := compileCached(&b.l.rtc, archFor(b.info.Major, b.info.Minor, b.opt.NVRTCTarget), b.hd)
	if err != nil {
		return err
	}
	if err := d.call("cuModuleLoadData", d.cuModuleLoadData, uintptr(unsafe.Pointer(&b.module)), uintptr(unsafe.Pointer(&res.image[0]))); err != nil {
		return err
	}
	for _, k := range kernelNames {
		var f uintptr
		kn := cString(k)
		if err := d.call("cuModuleGetFunction "+k, d.cuModuleGetFunction, uintptr(unsafe.Pointer(&f)), b.module, uintptr(unsafe.Pointer(&kn[0]))); err != nil {
			return err
		}
		b.fn[k] = f
	}

	return nil
}

// initBLAS creates the cuBLAS handle on b's stream with the precision's
// math mode and a fixed workspace.
func (b *Backend) initBLAS() error {
	bl := &b.l.blas
	if err := bl.err("cublasCreate", sc(bl.create, uintptr(unsafe.Pointer(&b.blas)))); err != nil {
		return err
	}
	if err := bl.err("cublasSetStream", sc(bl.setStream, b.blas, b.stream)); err != nil {
		return err
	}
	mode, ct := uintptr(cublasDefaultMath), uintptr(cublasCompute32F)
	if b.opt.Precision == "tf32" {
		mode, ct = cublasTF32TensorOpMath, cublasCompute32FTF32
	}
	if err := bl.err("cublasSetMathMode", sc(bl.setMathMode, b.blas, mode)); err != nil {
		return err
	}
	b.computeType = ct
	// A fixed cuBLAS workspace: cuBLAS must not allocate while a graph is
	// being captured.
	var err error
	if b.workspace, err = b.alloc(32 << 20); err != nil {
		return err
	}
	if err := bl.err("cublasSetWorkspace", sc(bl.setWorkspace, b.blas, b.workspace, 32<<20)); err != nil {
		return err
	}
	return nil
}

// sc is SyscallN returning only the low 32 bits of the result (a C enum).
// go:uintptrescapes for the reason given on driverFns.call.
//
//go:uintptrescapes
func sc(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return uint32r(r)
}

func (b *Backend) alloc(bytes int64) (uintptr, error) {
	if bytes <= 0 {
		bytes = 4
	}
	var p uintptr
	d := &b.l.drv
	if err := d.call(fmt.Sprintf("cuMemAlloc(%d bytes)", bytes), d.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(bytes)); err != nil {
		return 0, err
	}
	b.allocs[p] = true
	return p, nil
}

func (b *Backend) free(p uintptr) {
	if p != 0 && b.allocs[p] {
		d := &b.l.drv
		_ = d.call("cuMemFree", d.cuMemFree, p)
		delete(b.allocs, p)
	}
}

// upload copies host float32s to a new device buffer.
func (b *Backend) upload(src []float32) (uintptr, error) {
	p, err := b.alloc(int64(len(src)) * 4)
	if err != nil {
		return 0, err
	}
	if len(src) > 0 {
		d := &b.l.drv
		err = d.call("cuMemcpyHtoDAsync", d.cuMemcpyHtoDAsync, p, uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)*4), b.stream)
		if err == nil {
			// The source may be a temporary concatenation: finish before it
			// can be collected.
			err = b.sync()
		}
		runtime.KeepAlive(src)
	}
	return p, err
}

func (b *Backend) uploadWeights(m *model.Model) error {
	c, w := m.Config, m.Weights
	dm, ffn, V := c.HiddenSize, c.IntermediateSize, c.VocabSize
	nq, nkv := c.NumHeads*b.hd, c.NumKVHeads*b.hd
	check := func(name string, s []float32, n int) error {
		if len(s) != n {
			return fmt.Errorf("cuda: weight %s has %d values, want %d", name, len(s), n)
		}
		return nil
	}
	if err := errors.Join(check("embed", w.Embed, V*dm), check("final_norm", w.FinalNorm, dm), check("lm_head", w.LMHead, V*dm)); err != nil {
		return err
	}
	if len(w.Layers) != c.NumLayers {
		return fmt.Errorf("cuda: %d layers in weights, config says %d", len(w.Layers), c.NumLayers)
	}
	var total int64
	up := func(s []float32) (uintptr, error) { total += int64(len(s)) * 4; return b.upload(s) }
	var err error
	if b.embed, err = up(w.Embed); err != nil {
		return err
	}
	b.lmHead = b.embed
	if len(w.LMHead) > 0 && &w.LMHead[0] != &w.Embed[0] {
		if b.lmHead, err = up(w.LMHead); err != nil {
			return err
		}
	}
	if b.finalNorm, err = up(w.FinalNorm); err != nil {
		return err
	}
	b.gemvBF = b.gemvOK && b.gemvBFWanted(m)
	b.bf16GEMM = b.opt.Precision == "bf16"
	f, err := fusedPaths(b.opt, c, b.qkvDim)
	if err != nil {
		return err
	}
	b.gu16, b.fusedMLP, b.fusedNorm, b.fusedQKV = f.gu16, f.mlp, f.mlpNorm, f.qkv
	if b.gemvBF || b.bf16GEMM {
		if b.lmHeadBF, err = b.uploadBF16(w.LMHead); err != nil {
			return err
		}
		total += int64(len(w.LMHead)) * 2
	}
	for i, L := range w.Layers {
		p := fmt.Sprintf("layer %d ", i)
		if err := errors.Join(check(p+"attn_norm", L.AttnNorm, dm), check(p+"q", L.Wq, nq*dm), check(p+"k", L.Wk, nkv*dm),
			check(p+"v", L.Wv, nkv*dm), check(p+"o", L.Wo, dm*nq), check(p+"mlp_norm", L.MLPNorm, dm),
			check(p+"gate", L.WGate, ffn*dm), check(p+"up", L.WUp, ffn*dm), check(p+"down", L.WDown, dm*ffn)); err != nil {
			return err
		}
		var dl devLayer
		// Fused projections: rows of Wq, Wk, Wv stacked give one [qkvDim, d]
		// GEMM; rows of gate then up give one [2ffn, d] GEMM.
		qkv := make([]float32, 0, b.qkvDim*dm)
		qkv = append(append(append(qkv, L.Wq...), L.Wk...), L.Wv...)
		gu := make([]float32, 0, 2*ffn*dm)
		gu = append(append(gu, L.WGate...), L.WUp...)
		for _, x := range []struct {
			dst *uintptr
			src []float32
		}{{&dl.attnNorm, L.AttnNorm}, {&dl.wqkv, qkv}, {&dl.wo, L.Wo}, {&dl.mlpNorm, L.MLPNorm}, {&dl.wgu, gu}, {&dl.down, L.WDown}} {
			if *x.dst, err = up(x.src); err != nil {
				return err
			}
		}
		if b.gemvBF || b.bf16GEMM {
			for _, x := range []struct {
				dst *uintptr
				src []float32
			}{{&dl.wqkvBF, qkv}, {&dl.woBF, L.Wo}, {&dl.wguBF, gu}, {&dl.downBF, L.WDown}} {
				if *x.dst, err = b.uploadBF16(x.src); err != nil {
					return err
				}
				total += int64(len(x.src)) * 2
			}
		}
		if b.fusedMLP { // gemm_gu_silu's weights: gate and up rows interleaved
			il := make([]float32, 0, 2*ffn*dm)
			for j := 0; j < ffn; j++ {
				il = append(append(il, L.WGate[j*dm:(j+1)*dm]...), L.WUp[j*dm:(j+1)*dm]...)
			}
			if dl.wguIL, err = b.uploadBF16(il); err != nil {
				return err
			}
			total += int64(len(il)) * 2
		}
		b.layers = append(b.layers, dl)
	}
	// RoPE table as Hugging Face computes it: inv_freq and the angle in
	// float32, then cos/sin of that float32 angle.
	half := b.hd / 2
	cs := make([]float32, b.maxPos*half*2)
	theta := c.RopeTheta
	if theta == 0 {
		theta = 10000
	}
	for i := 0; i < half; i++ {
		inv := float32(1.0 / math.Pow(theta, float64(float32(2*i)/float32(b.hd))))
		for p := 0; p < b.maxPos; p++ {
			a := float64(float32(p) * inv)
			cs[(p*half+i)*2] = float32(math.Cos(a))
			cs[(p*half+i)*2+1] = float32(math.Sin(a))
		}
	}
	if b.cosSin, err = up(cs); err != nil {
		return err
	}
	b.info.WeightBytes = total
	return nil
}

// growScratch (re)allocates the activation buffers for n tokens.
func (b *Backend) growScratch(n int) error {
	if n <= b.capT {
		return nil
	}
	if b.capT > 0 {
		if err := b.sync(); err != nil {
			return err
		}
	}
	b.dropGraphs()
	c := b.cfg
	dm, ffn, V := int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.VocabSize)
	for _, x := range []struct {
		p     *uintptr
		elems int64
	}{
		{&b.x, dm}, {&b.h, dm}, {&b.qkv, int64(b.qkvDim)}, {&b.attn, int64(c.NumHeads * b.hd)},
		{&b.gu, 2 * ffn}, {&b.act, ffn}, {&b.xs, dm}, {&b.logitBuf, V}, {&b.lseBuf, 1},
		{&b.in16, (max(dm, int64(c.NumHeads*b.hd), ffn) + 1) / 2}, // bf16: two per float32
	} {
		b.free(*x.p)
		var err error
		if *x.p, err = b.alloc(x.elems * 4 * int64(n)); err != nil {
			return err
		}
	}
	b.capT = n
	return nil
}

func (b *Backend) ensureMeta(n int) error {
	if n <= b.capMeta {
		return nil
	}
	if b.capMeta > 0 {
		if err := b.sync(); err != nil {
			return err
		}
	}
	b.dropGraphs()
	b.free(b.meta)
	c := max(n, 2*b.capMeta, 1<<16)
	var err error
	if b.meta, err = b.alloc(int64(c) * 4); err != nil {
		b.capMeta = 0
		return err
	}
	b.capMeta = c
	return nil
}

func (b *Backend) allocCache() error {
	c := b.cfg
	b.blockElems = b.opt.BlockSize * c.NumKVHeads * b.hd
	perBlock := int64(2*c.NumLayers) * int64(b.blockElems) * 4
	var budget int64
	if b.opt.KVCacheBytes > 0 {
		budget = b.opt.KVCacheBytes
	} else {
		var free, total uint64
		d := &b.l.drv
		if err := d.call("cuMemGetInfo", d.cuMemGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total))); err != nil {
			return err
		}
		used := int64(total - free)
		budget = int64(b.opt.MemoryFraction*float64(total)) - used
	}
	n := budget / perBlock
	if b.opt.MaxBlocks > 0 && n > int64(b.opt.MaxBlocks) {
		n = int64(b.opt.MaxBlocks)
	}
	if lim := int64(math.MaxInt32)/int64(b.opt.BlockSize) - 1; n > lim {
		n = lim // slots are int32
	}
	if n < 1 {
		return fmt.Errorf("cuda: KV cache budget %d bytes is less than one block (%d bytes)", budget, perBlock)
	}
	var err error
	// One extra block, never handed to the engine, takes the K/V writes of
	// graph padding tokens.
	if b.cache, err = b.alloc((n + 1) * perBlock); err != nil {
		return err
	}
	b.numBlocks = int(n)
	b.allocBlocks = int(n) + 1
	b.info.KVCacheBytes = n * perBlock
	return nil
}

// Close implements forward.Backend: frees device memory and the context.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	err := b.do(func() error { b.release(); return nil })
	close(b.cmd)
	return err
}

// release frees everything the worker created (on the worker).
func (b *Backend) release() {
	d := &b.l.drv
	if b.stream != 0 {
		_ = b.sync()
	}
	b.releaseAsync()
	b.unpin()
	b.dropGraphs()
	if b.blas != 0 {
		sc(b.l.blas.destroy, b.blas)
		b.blas = 0
	}
	for p := range b.allocs {
		b.free(p)
	}
	if b.module != 0 {
		_ = d.call("cuModuleUnload", d.cuModuleUnload, b.module)
		b.module = 0
	}
	if b.stream != 0 {
		_ = d.call("cuStreamDestroy", d.cuStreamDestroy, b.stream)
		b.stream = 0
	}
	if b.ctx != 0 {
		_ = d.call("cuDevicePrimaryCtxRelease", d.cuDevicePrimaryCtxRelease, uintptr(b.dev))
		b.ctx = 0
	}
}

// fused says which of the cuBLAS path's optional kernels a backend runs.
type fused struct{ gu16, mlp, mlpNorm, qkv bool }

// fusedPaths checks the fused-kernel options against the precision and the
// model's shapes: a requested path that cannot run is an error, not a
// silent fallback. silu_mul16 loads 16 bytes (ffn % 8 == 0); the
// tensor-core GEMMs take whole 32-wide stages of the hidden size and
// column pairs. FusedMLPNorm implies FusedMLP and takes precedence over
// GateUpBF16, as FusedMLP does.
func fusedPaths(o Options, c model.Config, qkvDim int) (fused, error) {
	want := o.GateUpBF16 || o.FusedMLP || o.FusedMLPNorm || o.FusedQKVNorm
	if want && o.Precision != "bf16" {
		return fused{}, fmt.Errorf("cuda: the fused kernels (GateUpBF16, FusedMLP, FusedMLPNorm, FusedQKVNorm) need Precision bf16, not %q", o.Precision)
	}
	d, ffn := c.HiddenSize, c.IntermediateSize
	var f fused
	f.mlp = o.FusedMLP || o.FusedMLPNorm
	f.mlpNorm = o.FusedMLPNorm
	f.qkv = o.FusedQKVNorm
	f.gu16 = o.GateUpBF16 && !f.mlp
	switch {
	case f.gu16 && ffn%8 != 0:
		return fused{}, fmt.Errorf("cuda: GateUpBF16 needs an MLP size that is a multiple of 8, not %d", ffn)
	case (f.mlp || f.qkv) && d%tcBK != 0:
		return fused{}, fmt.Errorf("cuda: the tensor-core GEMMs (FusedMLP, FusedMLPNorm, FusedQKVNorm) need a hidden size that is a multiple of %d, not %d", tcBK, d)
	case f.qkv && qkvDim%2 != 0:
		return fused{}, fmt.Errorf("cuda: FusedQKVNorm needs an even QKV width, not %d", qkvDim)
	}
	return f, nil
}
