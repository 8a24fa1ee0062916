package cuda

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"chunlian/forward"
)

// Asynchronous device draws: Backend as forward.AsyncDrawBackend.
//
// LaunchDraw hands ForwardDraw's work to the CUDA worker and returns at
// once: the worker packs the step's metadata, enqueues the forward pass
// (graph or eager), draw_rows, gather_rows, the three copies back and
// mark_done, and records the slot's event, while the caller goes on (the
// engine waits for and consumes the other slot's step meanwhile). So the
// caller must leave the batch, the draws, the host rows and the block
// tables the batch refers to unchanged until WaitDraw(slot) returns (the
// forward.AsyncDrawBackend contract); errors of the launch, validation
// included, come back from WaitDraw.
//
// WaitDraw first takes the worker's report of the launch (a channel: it
// orders the worker's writes before the caller's reads), then polls the
// slot's done word, which mark_done sets to the launch's sequence number
// once the copies back are complete: the caller copies the results out of
// page-locked memory without a round trip to the CUDA thread, which may
// be busy enqueueing the next launch. Only when the word does not come
// within waitSpin (a long step, a device fault, spinning disabled) does it
// ask the worker to synchronise on the slot's event, which also reports
// the device's errors.
//
// Everything runs on the one stream, so launches, CopyBlocks and
// RegisterMask execute on the device in call order and one step's kernels
// never overlap another's: the single device copies of the metadata, the
// activations, the logits, the draws' results and the gathered rows are
// shared by the slots safely. What the slots own is host memory that the
// device reads or writes after LaunchDraw has returned: a page-locked
// input buffer (the step's metadata: a copy from pageable memory may
// synchronise with the stream, see run), a page-locked output buffer
// (draws' results | host rows | log-sum-exps: a copy into pageable memory
// is synchronous with respect to the host) and the done word. They grow
// (free + allocate) only in the worker's launch, when the slot has no
// launch outstanding.
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

// asyncSlot is one slot's state. busy and done are the caller's (under
// Backend.mu; the worker's release resets them while the caller holds
// mu); the rest is the worker's.
type asyncSlot struct {
	busy bool          // a launch is outstanding (LaunchDraw called, WaitDraw not done)
	done chan launched // cap 1: the worker's report of the outstanding launch

	in, out, flag pinnedBuf // metadata, results, done word (flag: mark_done's target)
	event         uintptr
	seq           uint32 // launches on this slot so far; the done word's next value
}

// launched is the worker's report of one LaunchDraw, sent on the slot's
// done channel: an error (nothing is left enqueued then), or what WaitDraw
// needs to find the results.
type launched struct {
	err               error
	nD, nH, R         int  // draws, host rows, logits rows
	lse               bool // log-sum-exps copied back
	out               uintptr
	outLogits, outLSE int // byte offsets in out of the host rows and the lse
	flag              uintptr
	seq               uint32 // the value mark_done writes to flag
	event             uintptr
}

// waitSpin bounds how long WaitDraw polls the done word before it asks
// the worker to wait on the event: far above a step's device time (a
// 2,048-sequence step is ~1.5 ms on an H200), so the fallback only runs
// for errors and unusual steps.
const waitSpin = 20 * time.Millisecond

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
// is synchronised already; the caller holds mu).
func (b *Backend) releaseAsync() {
	d := &b.l.drv
	for i := range b.slots {
		s := &b.slots[i]
		b.freePinned(&s.in)
		b.freePinned(&s.out)
		b.freePinned(&s.flag)
		if s.event != 0 {
			_ = d.call("cuEventDestroy", d.cuEventDestroy, s.event)
			s.event = 0
		}
		s.busy, s.done = false, nil
	}
}

// asyncIdle returns an error naming what when a launch is outstanding
// (the synchronous calls must not interleave with launches). The caller
// holds mu.
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

// lockSlot returns slot's state with mu held (the caller unlocks it), or
// an error for a bad slot or a closed backend (mu not held).
func (b *Backend) lockSlot(slot int) (*asyncSlot, error) {
	if err := checkSlot(slot); err != nil {
		return nil, err
	}
	if err := b.lockOpen(); err != nil {
		return nil, err
	}
	return &b.slots[slot], nil
}

// LaunchDraw implements forward.AsyncDrawBackend: ForwardDraw's work on
// slot, handed to the worker without waiting (see the file comment).
// Only a bad or busy slot and a closed backend are reported here; the
// launch's own errors come back from WaitDraw.
func (b *Backend) LaunchDraw(slot int, bt *forward.Batch, draws []forward.Draw, hostRows []int32) error {
	s, err := b.lockSlot(slot)
	if err != nil {
		return err
	}
	defer b.mu.Unlock()
	if s.busy {
		return fmt.Errorf("cuda: LaunchDraw on slot %d, which holds a launch not waited for", slot)
	}
	if s.done == nil {
		s.done = make(chan launched, 1)
	}
	s.busy = true
	b.cmd <- func() { s.done <- b.launchDraw(slot, bt, draws, hostRows) }
	return nil
}

// launchDraw is LaunchDraw on the worker.
func (b *Backend) launchDraw(slot int, bt *forward.Batch, draws []forward.Draw, hostRows []int32) launched {
	s := &b.slots[slot]
	d := &b.l.drv
	if s.event == 0 {
		if err := d.call("cuEventCreate", d.cuEventCreate, uintptr(unsafe.Pointer(&s.event)), cuEventDisableTiming); err != nil {
			s.event = 0
			return launched{err: err}
		}
	}
	if s.flag.p == 0 {
		if err := b.growPinned(&s.flag, 4); err != nil {
			return launched{err: err}
		}
		*(*uint32)(hostPtr(s.flag.p)) = s.seq
	}
	V, R := b.cfg.VocabSize, len(bt.LogitRows)
	nD, nH := len(draws), len(hostRows)
	r := launched{nD: nD, nH: nH, R: R, lse: R > 0, flag: s.flag.p, event: s.event}
	r.outLogits = nD * 8
	r.outLSE = r.outLogits + nH*V*4
	outBytes := r.outLSE
	if r.lse {
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
		return launched{err: errs}
	}
	r.out = s.out.p
	if errs == nil && nD > 0 {
		errs = d.call("cuMemcpyDtoHAsync(draws)", d.cuMemcpyDtoHAsync, s.out.p, b.drawOut, uintptr(nD*8), b.stream)
	}
	if errs == nil && nH > 0 {
		errs = d.call("cuMemcpyDtoHAsync(logits)", d.cuMemcpyDtoHAsync, s.out.p+uintptr(r.outLogits), st.src, uintptr(nH*V*4), b.stream)
	}
	if errs == nil && r.lse {
		errs = d.call("cuMemcpyDtoHAsync(lse)", d.cuMemcpyDtoHAsync, s.out.p+uintptr(r.outLSE), b.lseBuf, uintptr(R*4), b.stream)
	}
	s.seq++
	r.seq = s.seq
	if errs == nil {
		errs = b.launch("mark_done", 1, 1, 1, uint64(s.flag.p), uint64(r.seq))
	}
	if errs == nil {
		errs = d.call("cuEventRecord", d.cuEventRecord, s.event, b.stream)
	}
	if errs != nil {
		// Part of the step may be enqueued: let it finish before the
		// slot's staging can be reused.
		return launched{err: errors.Join(errs, b.sync())}
	}
	return r
}

// WaitDraw implements forward.AsyncDrawBackend: it waits for slot's
// launch (its done word, or its event: a later launch on the other slot
// keeps running) and copies the results out of the slot's staging: out
// must hold exactly the launch's draws, logits at least its host rows × V
// (the rest is not written), lse at least its logits rows (the rest is not
// written). A length error
// leaves the launch outstanding; any other error (the launch's, or the
// device's seen at the wait) ends it.
func (b *Backend) WaitDraw(slot int, out []forward.Drawn, logits []float32, lse []float32) error {
	s, err := b.lockSlot(slot)
	if err != nil {
		return err
	}
	defer b.mu.Unlock()
	if !s.busy {
		return fmt.Errorf("cuda: WaitDraw on slot %d, which holds no launch", slot)
	}
	r := spinRecv(b.spin, s.done)
	if r.err != nil {
		s.busy = false
		return r.err
	}
	if err := b.deferredErr(); err != nil {
		// An earlier CopyBlocks failed: report it, after the launch is
		// done with the slot's staging.
		s.busy = false
		d := &b.l.drv
		return errors.Join(err, b.do(func() error { return d.call("cuEventSynchronize", d.cuEventSynchronize, r.event) }))
	}
	V := b.cfg.VocabSize
	var lenErr error
	switch {
	case len(out) != r.nD:
		lenErr = fmt.Errorf("cuda: WaitDraw(slot %d): %d results for %d draws", slot, len(out), r.nD)
	case len(logits) < r.nH*V:
		lenErr = fmt.Errorf("cuda: WaitDraw(slot %d): logits buffer %d < %d host rows × %d", slot, len(logits), r.nH, V)
	case r.lse && len(lse) < r.R:
		lenErr = fmt.Errorf("cuda: WaitDraw(slot %d): lse buffer %d < %d logits rows", slot, len(lse), r.R)
	}
	if lenErr != nil {
		s.done <- r // still outstanding
		return lenErr
	}
	s.busy = false
	if !b.pollDone(r) {
		d := &b.l.drv
		if err := b.do(func() error { return d.call("cuEventSynchronize", d.cuEventSynchronize, r.event) }); err != nil {
			return err
		}
		b.slowWaits++
	} else {
		b.fastWaits++
	}
	base := hostPtr(r.out)
	if r.nD > 0 {
		copy(out, unsafe.Slice((*forward.Drawn)(base), r.nD))
	}
	if r.nH > 0 {
		copy(logits, unsafe.Slice((*float32)(unsafe.Add(base, r.outLogits)), r.nH*V))
	}
	if r.lse {
		copy(lse, unsafe.Slice((*float32)(unsafe.Add(base, r.outLSE)), r.R))
	}
	return nil
}

// pollDone reports whether r's done word reached r.seq within waitSpin
// (one look when spinning is off). The word is written by the device
// after the launch's copies back, so what they wrote is visible once it
// is seen.
func (b *Backend) pollDone(r launched) bool {
	if b.noPoll {
		return false
	}
	p := (*uint32)(hostPtr(r.flag))
	if atomic.LoadUint32(p) == r.seq {
		return true
	}
	if b.spin <= 0 {
		return false
	}
	t0 := time.Now()
	for i := 1; ; i++ {
		if atomic.LoadUint32(p) == r.seq {
			return true
		}
		if i%256 == 0 && time.Since(t0) > waitSpin {
			return false
		}
	}
}

// WaitStats returns how many WaitDraw calls found their launch done by
// polling its done word (fast) and how many fell back to the worker's
// event synchronisation (slow).
func (b *Backend) WaitStats() (fast, slow int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fastWaits, b.slowWaits
}
