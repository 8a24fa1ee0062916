package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"chunlian/forward"
)

// Device draws: Backend as forward.DrawBackend.
//
// ForwardDraw runs the step like Forward, then, on the same stream:
// draw_rows (kernels/draw.cu) draws every forward.Draw from its logits row
// where the row lies (one block of drawThreads threads per draw, the row's
// probabilities in shared memory), gather_rows packs the rows the host
// still reads (hostRows) into one contiguous buffer unless they already
// are the first rows in order, and only the draws' results (8 bytes each),
// the log-sum-exps and those rows come back: one metadata copy in, three
// copies out, one stream sync. The draw is sampler.DrawRow's definition
// (see there); only the summation order of the float64 sums differs.
//
// The draw specs travel at the end of the step's int32 metadata (after
// the possibly graph-padded batch metadata, so the graphs' offsets stay
// put): specs [nDraws, drawWords] | hostRows [nHost] | exclude lists.
// A spec is row, force, mask, the bits of temperature, top-p and min-p,
// top-k, the low and high words of the bits of U, the offset of its
// exclude list in the exclude section and its length.

const (
	drawThreads = 512 // DRAW_THREADS in kernels/draw.cu
	drawWords   = 11  // DRAW_WORDS
	// maxMasks is the number of mask slots RegisterMask offers.
	maxMasks = 64
	// drawStaticShm bounds draw_rows' static shared memory (its
	// reductions' partials take 576 bytes); drawMaxShm is what a kernel
	// may use without opting in to more.
	drawStaticShm = 1024
	drawMaxShm    = 48 << 10
	gatherThreads = 256
)

// forward.Drawn is what draw_rows writes per draw: int32 token, float32
// logit; the results are copied straight into the caller's slice.
var _ [0]struct{} = [unsafe.Sizeof(forward.Drawn{}) - 8]struct{}{}

// drawShmOK reports whether a row of V float32s fits draw_rows' shared
// memory.
func drawShmOK(V int) bool { return V >= 1 && V*4+drawStaticShm <= drawMaxShm }

// DrawVocab implements forward.DrawBackend: the model's rows fit draw_rows'
// shared memory (V ≤ 12,032); the engine reads the log-sum-exps (always
// computed) for the drawn tokens' log-probabilities.
func (b *Backend) DrawVocab() bool { return drawShmOK(b.cfg.VocabSize) }

// maskWords is the length of one registered mask in uint64s.
func (b *Backend) maskWords() int { return (b.cfg.VocabSize + 63) / 64 }

// RegisterMask implements forward.DrawBackend: it copies allowed (bits
// past the vocabulary ignored, missing words = not allowed) into the next
// of maxMasks device slots and returns its index.
func (b *Backend) RegisterMask(allowed []uint64) (int32, error) {
	if err := b.lockOpen(); err != nil {
		return -1, err
	}
	defer b.mu.Unlock()
	idx := int32(-1)
	err := b.do(func() error {
		if b.nMasks >= maxMasks {
			return fmt.Errorf("cuda: RegisterMask: all %d mask slots are taken", maxMasks)
		}
		W := b.maskWords()
		if b.masks == 0 {
			p, err := b.alloc(int64(maxMasks) * int64(W) * 8)
			if err != nil {
				return err
			}
			b.masks = p
		}
		h := make([]uint64, W)
		copy(h, allowed)
		d := &b.l.drv
		dst := b.masks + uintptr(b.nMasks*W*8)
		// No stream sync: the driver stages the pageable h before the copy
		// returns, and no launch in flight reads this new slot.
		err := d.call("cuMemcpyHtoDAsync(mask)", d.cuMemcpyHtoDAsync, dst, uintptr(unsafe.Pointer(&h[0])), uintptr(W*8), b.stream)
		runtime.KeepAlive(h)
		if err != nil {
			return err
		}
		idx = int32(b.nMasks)
		b.nMasks++
		return nil
	})
	return idx, err
}

// ForwardDraw implements forward.DrawBackend.
func (b *Backend) ForwardDraw(bt *forward.Batch, draws []forward.Draw, out []forward.Drawn, hostRows []int32, logits []float32) error {
	if len(out) != len(draws) {
		return fmt.Errorf("cuda: ForwardDraw with %d draws and %d results", len(draws), len(out))
	}
	return b.syncCall(func() error { return b.forwardDraw(bt, draws, out, hostRows, logits) })
}

// packDraws validates draws and hostRows for a step of R logits rows and
// a vocabulary of V (nMasks masks registered) and appends their device
// form to dst: specs [len(draws), drawWords] | hostRows | exclude lists
// (see the file comment). It makes no CUDA call.
func packDraws(dst []int32, draws []forward.Draw, hostRows []int32, R, V, nMasks int) ([]int32, error) {
	for k, r := range hostRows {
		if r < 0 || int(r) >= R {
			return dst, fmt.Errorf("cuda: host row %d (#%d) out of [0,%d)", r, k, R)
		}
	}
	nEx := 0
	for i := range draws {
		d := &draws[i]
		var bad string
		switch {
		case d.Row < 0 || int(d.Row) >= R:
			bad = fmt.Sprintf("row %d out of [0,%d)", d.Row, R)
		case d.Force >= int32(V):
			bad = fmt.Sprintf("forced token %d out of [0,%d)", d.Force, V)
		case d.Mask < -1 || int(d.Mask) >= nMasks:
			bad = fmt.Sprintf("mask %d out of [-1,%d)", d.Mask, nMasks)
		case len(d.Exclude) > forward.MaxDrawExclude:
			bad = fmt.Sprintf("%d excluded tokens > %d", len(d.Exclude), forward.MaxDrawExclude)
		case d.Force >= 0:
		// A forced draw reads nothing else (U and the parameters unused).
		case math.IsNaN(float64(d.Temperature)) || d.Temperature < 0:
			bad = fmt.Sprintf("temperature %v not ≥ 0", d.Temperature)
		case math.IsNaN(float64(d.TopP)) || math.IsNaN(float64(d.MinP)) || d.MinP > 1:
			bad = fmt.Sprintf("top-p %v / min-p %v (NaN, or min-p > 1)", d.TopP, d.MinP)
		case d.Temperature != 0 && !(d.U >= 0 && d.U < 1):
			bad = fmt.Sprintf("U %v not in [0,1)", d.U)
		}
		if bad != "" {
			return dst, fmt.Errorf("cuda: draw %d: %s", i, bad)
		}
		nEx += len(d.Exclude)
	}
	n := len(draws)*drawWords + len(hostRows) + nEx
	base := len(dst)
	dst = growInt32(dst, base+n)
	spec, hr, ex := dst[base:base+len(draws)*drawWords], dst[base+len(draws)*drawWords:base+len(draws)*drawWords+len(hostRows)], dst[base+len(draws)*drawWords+len(hostRows):]
	copy(hr, hostRows)
	eo := 0
	for i := range draws {
		d := &draws[i]
		s := spec[i*drawWords : (i+1)*drawWords]
		ub := math.Float64bits(d.U)
		s[0], s[1], s[2] = d.Row, d.Force, d.Mask
		s[3] = int32(math.Float32bits(d.Temperature))
		s[4] = int32(math.Float32bits(d.TopP))
		s[5] = int32(math.Float32bits(d.MinP))
		s[6] = d.TopK
		s[7], s[8] = int32(uint32(ub)), int32(uint32(ub>>32))
		s[9], s[10] = int32(eo), int32(len(d.Exclude))
		eo += copy(ex[eo:], d.Exclude)
	}
	return dst, nil
}

// growInt32 returns s extended to length n (contents kept, capacity to
// spare when it has to move).
func growInt32(s []int32, n int) []int32 {
	if n <= cap(s) {
		return s[:n]
	}
	t := make([]int32, n, n+n/2)
	copy(t, s)
	return t
}

// isPrefix reports whether rows is 0, 1, …, len(rows)-1: those rows are
// already contiguous at the start of the logits buffer.
func isPrefix(rows []int32) bool {
	for k, r := range rows {
		if int(r) != k {
			return false
		}
	}
	return true
}

// growDraws makes room for nDraws results and, when gather, nHost
// gathered rows (regrow: it syncs before replacing a buffer that an
// asynchronous launch may still be using).
func (b *Backend) growDraws(nDraws, nHost int, gather bool) error {
	if err := b.regrow(&b.drawOut, &b.capDraws, nDraws, 256, 8); err != nil {
		return err
	}
	if gather {
		return b.regrow(&b.gatherBuf, &b.capGather, nHost, 8, int64(b.cfg.VocabSize)*4)
	}
	return nil
}

// regrow replaces the device buffer *p of *capN units (unit bytes each)
// by one of at least need units — doubling, at least floor — when need
// does not fit; the contents are not kept. A buffer being replaced is
// freed only after a stream sync (work in flight may still use it); on
// an allocation error *p and *capN are left 0.
func (b *Backend) regrow(p *uintptr, capN *int, need, floor int, unit int64) error {
	if need <= *capN {
		return nil
	}
	if *capN > 0 {
		if err := b.sync(); err != nil {
			return err
		}
	}
	b.free(*p)
	c := max(need, 2**capN, floor)
	np, err := b.alloc(int64(c) * unit)
	if err != nil {
		*p, *capN = 0, 0
		return err
	}
	*p, *capN = np, c
	return nil
}

// drawStep describes a step enqueueDraw enqueued: its draws, host rows,
// logits rows, and the device rows the host rows are copied from (the
// gathered buffer, or the logits buffer when they are its first rows).
type drawStep struct {
	nD, nH, R int
	src       uintptr
}

// enqueueDraw validates the step, packs its metadata and enqueues the
// forward pass, draw_rows and gather_rows: ForwardDraw's and LaunchDraw's
// work up to the copies back. stage, when not nil, is called with the
// packed metadata once nothing can fail any more before the enqueueing
// and returns a page-locked copy to upload from (0: upload from the
// pageable metadata). started is false when nothing was enqueued (err is
// then a validation or allocation error); when true, the stream holds
// work even if err is not nil, and the caller must sync before reporting.
func (b *Backend) enqueueDraw(bt *forward.Batch, draws []forward.Draw, hostRows []int32, stage func(meta []int32) (uintptr, error)) (st drawStep, started bool, err error) {
	V, R := b.cfg.VocabSize, len(bt.LogitRows)
	nD, nH := len(draws), len(hostRows)
	st = drawStep{nD: nD, nH: nH, R: R}
	if nD > 0 && !drawShmOK(V) {
		return st, false, fmt.Errorf("cuda: vocabulary %d too large for device draws", V)
	}
	off, stride, err := b.prepareMeta(bt)
	if err != nil {
		return st, false, err
	}
	if b.drawMeta, err = packDraws(b.drawMeta[:0], draws, hostRows, R, V, b.nMasks); err != nil {
		return st, false, err
	}
	meta, off, tp := b.stepMeta(bt, off, stride)
	base := len(meta)
	meta = append(meta, b.drawMeta...)
	// Keep the grown buffer for the next step.
	if tp > 0 {
		b.padBuf = meta
	} else {
		b.hostMeta = meta
	}
	gather := nH > 0 && !isPrefix(hostRows)
	if err := b.growDraws(nD, nH, gather); err != nil {
		return st, false, err
	}
	var src uintptr
	if stage != nil {
		if src, err = stage(meta); err != nil {
			return st, false, err
		}
	}
	errs := b.run(meta, src, off, len(bt.Tokens), R, stride, tp)
	specs := uint64(b.meta + uintptr(base*4))
	rows := specs + uint64(nD*drawWords*4)
	excl := rows + uint64(nH*4)
	if errs == nil && nD > 0 {
		errs = b.launchShm("draw_rows", nD, 1, drawThreads, V*4, uint64(b.drawOut), uint64(b.logitBuf), i32(V),
			specs, excl, uint64(b.masks), i32(b.maskWords()))
	}
	st.src = b.logitBuf
	if errs == nil && gather {
		errs = b.launch("gather_rows", nH, 1, gatherThreads, uint64(b.gatherBuf), uint64(b.logitBuf), rows, i32(V))
		st.src = b.gatherBuf
	}
	return st, true, errs
}

// forwardDraw is ForwardDraw on the worker.
func (b *Backend) forwardDraw(bt *forward.Batch, draws []forward.Draw, out []forward.Drawn, hostRows []int32, logits []float32) error {
	if err := b.asyncIdle("ForwardDraw"); err != nil {
		return err
	}
	V := b.cfg.VocabSize
	if nH := len(hostRows); len(logits) < nH*V {
		return fmt.Errorf("cuda: logits buffer %d < %d host rows × %d", len(logits), nH, V)
	}
	st, started, errs := b.enqueueDraw(bt, draws, hostRows, nil)
	if !started {
		return errs
	}
	d := &b.l.drv
	if errs == nil && st.nD > 0 {
		errs = d.call("cuMemcpyDtoHAsync(draws)", d.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&out[0])), b.drawOut, uintptr(st.nD*8), b.stream)
	}
	if errs == nil && st.nH > 0 {
		b.pin(logits)
		errs = d.call("cuMemcpyDtoHAsync(logits)", d.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&logits[0])), st.src, uintptr(st.nH*V*4), b.stream)
	}
	errs = b.copyLSE(errs, st.R)
	if err := b.sync(); err != nil {
		return errors.Join(errs, err)
	}
	runtime.KeepAlive(logits)
	runtime.KeepAlive(out)
	return errs
}
