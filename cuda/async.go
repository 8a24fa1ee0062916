package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"chunlian/forward"
)

// Asynchronous device draws: Backend as forward.AsyncDrawBackend.
//
// LaunchDraw enqueues ForwardDraw's work — metadata upload, forward pass
// (graph or eager), draw_rows, gather_rows and the three copies back — and
// records the slot's event, without waiting; WaitDraw waits for that event
// only and copies the results out. So the engine can keep two steps in
// flight on slots 0 and 1: launch step N, then wait for and consume step
// N−1 while the device computes N.
//
// Everything runs on the one stream, so launches, CopyBlocks and
// RegisterMask execute on the device in call order and one step's kernels
// never overlap another's: the single device copies of the metadata, the
// activations, the logits, the draws' results and the gathered rows are
// shared by the slots safely. What the slots own is host memory that the
// device reads or writes after LaunchDraw has returned: a page-locked
// input buffer (the step's metadata: a copy from pageable memory may
// synchronise with the stream, see run) and a page-locked output buffer
// (draws' results | host rows | log-sum-exps: a copy into pageable memory
// is synchronous with respect to the host). They grow (free + allocate)
// only at LaunchDraw, when the slot has no launch outstanding.
//
// Nothing between a launch and its wait synchronises the stream, except
// the growth of a device buffer (growScratch, ensureMeta, growDraws sync
// before freeing what a launch in flight may still use; growth is rare).
//
// Forward and ForwardDraw are the synchronous style; a caller uses one
// style at a time: they return an error while a launch is outstanding.
// LaunchDraw/WaitDraw leave LogSumExp unchanged (it keeps returning the
// last Forward/ForwardDraw's); WaitDraw returns the launch's log-sum-exps.

// asyncSlots is the number of launches that may be outstanding.
const asyncSlots = 2

// cuEventDisableTiming: cuda.h CU_EVENT_DISABLE_TIMING (a cheaper event).
const cuEventDisableTiming = 2

var _ forward.AsyncDrawBackend = (*Backend)(nil)

// pinnedBuf is a page-locked host allocation (cuMemAllocHost).
type pinnedBuf struct {
	p     uintptr
	bytes int
}

// asyncSlot is one slot's state (owned by the worker).
type asyncSlot struct {
	busy      bool // a launch is outstanding
	in, out   pinnedBuf
	event     uintptr
	nD, nH, R int // the outstanding launch's draws, host rows, logits rows
	lse       bool
	outLogits int // byte offsets in out of the host rows and the lse
	outLSE    int
}

// hostPtr turns the address of C (page-locked) memory into a pointer;
// the Go collector ignores it, the memory is freed by freePinned.
func hostPtr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// growPinned makes pb hold at least bytes (contents not kept). Only for
// a buffer no outstanding work uses.
func (b *Backend) growPinned(pb *pinnedBuf, bytes int) error {
	if bytes <= pb.bytes {
		return nil
	}
	b.freePinned(pb)
	c := max(bytes, 2*pb.bytes, 64<<10)
	var p uintptr
	d := &b.l.drv
	if err := d.call(fmt.Sprintf("cuMemAllocHost(%d bytes)", c), d.cuMemAllocHost, uintptr(unsafe.Pointer(&p)), uintptr(c)); err != nil {
		return err
	}
	pb.p, pb.bytes = p, c
	return nil
}

func (b *Backend) freePinned(pb *pinnedBuf) {
	if pb.p != 0 {
		d := &b.l.drv
		_ = d.call("cuMemFreeHost", d.cuMemFreeHost, pb.p)
	}
	pb.p, pb.bytes = 0, 0
}

// releaseAsync frees the slots' staging and events (release: the stream
// is synchronised already).
func (b *Backend) releaseAsync() {
	d := &b.l.drv
	for i := range b.slots {
		s := &b.slots[i]
		b.freePinned(&s.in)
		b.freePinned(&s.out)
		if s.event != 0 {
			_ = d.call("cuEventDestroy", d.cuEventDestroy, s.event)
			s.event = 0
		}
		s.busy = false
	}
}

// asyncIdle returns an error naming what when a launch is outstanding
// (the synchronous calls must not interleave with launches).
func (b *Backend) asyncIdle(what string) error {
	for i := range b.slots {
		if b.slots[i].busy {
			return fmt.Errorf("cuda: %s while slot %d holds a LaunchDraw (wait for it first)", what, i)
		}
	}
	return nil
}

func checkSlot(slot int) error {
	if slot < 0 || slot >= asyncSlots {
		return fmt.Errorf("cuda: slot %d out of [0,%d)", slot, asyncSlots)
	}
	return nil
}

// LaunchDraw implements forward.AsyncDrawBackend: ForwardDraw's work on
// slot, enqueued without waiting (see the file comment). Validation
// errors come back here and leave the slot free; so does an enqueueing
// error (after a stream sync). Errors the device reports later come back
// from WaitDraw.
func (b *Backend) LaunchDraw(slot int, bt *forward.Batch, draws []forward.Draw, hostRows []int32) error {
	return b.onSlot(slot, func() error { return b.launchDraw(slot, bt, draws, hostRows) })
}

// onSlot runs f on the CUDA worker for a valid slot of an open backend.
func (b *Backend) onSlot(slot int, f func() error) error {
	if err := checkSlot(slot); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errors.New("cuda: backend closed")
	}
	return b.do(f)
}

// launchDraw is LaunchDraw on the worker.
func (b *Backend) launchDraw(slot int, bt *forward.Batch, draws []forward.Draw, hostRows []int32) error {
	s := &b.slots[slot]
	if s.busy {
		return fmt.Errorf("cuda: LaunchDraw on slot %d, which holds a launch not waited for", slot)
	}
	d := &b.l.drv
	if s.event == 0 {
		if err := d.call("cuEventCreate", d.cuEventCreate, uintptr(unsafe.Pointer(&s.event)), cuEventDisableTiming); err != nil {
			s.event = 0
			return err
		}
	}
	V, R := b.cfg.VocabSize, len(bt.LogitRows)
	nD, nH := len(draws), len(hostRows)
	lse := b.opt.RowLogSumExp && R > 0
	outLogits := nD * 8
	outLSE := outLogits + nH*V*4
	outBytes := outLSE
	if lse {
		outBytes += R * 4
	}
	stage := func(meta []int32) (uintptr, error) {
		if err := b.growPinned(&s.out, outBytes); err != nil {
			return 0, err
		}
		if err := b.growPinned(&s.in, len(meta)*4); err != nil {
			return 0, err
		}
		copy(unsafe.Slice((*int32)(hostPtr(s.in.p)), len(meta)), meta)
		return s.in.p, nil
	}
	st, started, errs := b.enqueueDraw(bt, draws, hostRows, stage)
	if !started {
		return errs
	}
	if errs == nil && nD > 0 {
		errs = d.call("cuMemcpyDtoHAsync(draws)", d.cuMemcpyDtoHAsync, s.out.p, b.drawOut, uintptr(nD*8), b.stream)
	}
	if errs == nil && nH > 0 {
		errs = d.call("cuMemcpyDtoHAsync(logits)", d.cuMemcpyDtoHAsync, s.out.p+uintptr(outLogits), st.src, uintptr(nH*V*4), b.stream)
	}
	if errs == nil && lse {
		errs = d.call("cuMemcpyDtoHAsync(lse)", d.cuMemcpyDtoHAsync, s.out.p+uintptr(outLSE), b.lseBuf, uintptr(R*4), b.stream)
	}
	if errs == nil {
		errs = d.call("cuEventRecord", d.cuEventRecord, s.event, b.stream)
	}
	if errs != nil {
		// Part of the step may be enqueued: let it finish before the
		// slot's staging can be reused.
		return errors.Join(errs, b.sync())
	}
	s.busy = true
	s.nD, s.nH, s.R, s.lse = nD, nH, R, lse
	s.outLogits, s.outLSE = outLogits, outLSE
	return nil
}

// WaitDraw implements forward.AsyncDrawBackend: it waits for slot's
// launch (its event only: a later launch on the other slot keeps
// running) and copies the results out of the slot's staging: out must
// hold exactly the launch's draws, logits at least its host rows × V
// (the rest is not written), lse at least its logits rows when
// Options.RowLogSumExp (the rest is not written; without RowLogSumExp lse
// is not written at all, as LogSumExp is nil then). A length error
// leaves the launch outstanding; any other error (the device's, seen at
// the wait) ends it.
func (b *Backend) WaitDraw(slot int, out []forward.Drawn, logits []float32, lse []float32) error {
	return b.onSlot(slot, func() error { return b.waitDraw(slot, out, logits, lse) })
}

// waitDraw is WaitDraw on the worker.
func (b *Backend) waitDraw(slot int, out []forward.Drawn, logits []float32, lse []float32) error {
	s := &b.slots[slot]
	V := b.cfg.VocabSize
	switch {
	case !s.busy:
		return fmt.Errorf("cuda: WaitDraw on slot %d, which holds no launch", slot)
	case len(out) != s.nD:
		return fmt.Errorf("cuda: WaitDraw(slot %d): %d results for %d draws", slot, len(out), s.nD)
	case len(logits) < s.nH*V:
		return fmt.Errorf("cuda: WaitDraw(slot %d): logits buffer %d < %d host rows × %d", slot, len(logits), s.nH, V)
	case s.lse && len(lse) < s.R:
		return fmt.Errorf("cuda: WaitDraw(slot %d): lse buffer %d < %d logits rows", slot, len(lse), s.R)
	}
	s.busy = false
	d := &b.l.drv
	if err := d.call("cuEventSynchronize", d.cuEventSynchronize, s.event); err != nil {
		return err
	}
	base := hostPtr(s.out.p)
	if s.nD > 0 {
		copy(out, unsafe.Slice((*forward.Drawn)(base), s.nD))
	}
	if s.nH > 0 {
		copy(logits, unsafe.Slice((*float32)(unsafe.Add(base, s.outLogits)), s.nH*V))
	}
	if s.lse {
		copy(lse, unsafe.Slice((*float32)(unsafe.Add(base, s.outLSE)), s.R))
	}
	return nil
}
