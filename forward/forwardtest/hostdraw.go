// Package forwardtest holds test doubles of forward's interfaces for the
// tests of the packages above it (like net/http/httptest): HostDraws gives
// any forward.Backend the device-draw interfaces, drawing on the host.
package forwardtest

import (
	"fmt"

	"chunlian/forward"
	"chunlian/sampler"
)

// HostDraws gives any Backend the AsyncDrawBackend interface by running
// its Forward for every row and then drawing on the host with
// sampler.DrawRow, the definition the GPU's draws implement. It is the
// reference for the device path: engine and couplet tests run the
// engine's draw planning and its two steps in flight on it without a GPU.
// Like the GPU's, its launches are asynchronous: LaunchDraw runs the work
// on a goroutine of its own, which reads the batch, the draws, the host
// rows and the block tables while the caller goes on, so a caller that
// changes them before WaitDraw is a data race the race detector reports.
// Work stays in call order: every call but WaitDraw first waits for the
// launch still running (settle). It costs what the host path costs plus
// the draws, so production CPU serving does not use it.
func HostDraws(b forward.Backend) forward.AsyncDrawBackend { return &hostDraws{Backend: b} }

// hostDraws is used from one goroutine at a time (the engine's), plus the
// goroutine of the one launch running, which owns all, lse, masks and
// the wrapped Backend until settle.
type hostDraws struct {
	forward.Backend
	masks   [][]uint64
	all     []float32 // [R, V] every row of the last ForwardDraw
	lse     []float32 // [R]
	slots   [2]hostSlot
	running chan struct{} // closed when the running launch is done; nil: none
}

// hostSlot is one LaunchDraw's results, kept until its WaitDraw; the
// launch's goroutine writes them before closing done.
type hostSlot struct {
	busy   bool
	done   chan struct{}
	err    error
	out    []forward.Drawn
	logits []float32
	lse    []float32
}

// settle waits for the running launch, if any.
func (h *hostDraws) settle() {
	if h.running != nil {
		<-h.running
		h.running = nil
	}
}

func (h *hostDraws) CopyBlocks(src, dst, slots []int32) error {
	h.settle()
	return h.Backend.CopyBlocks(src, dst, slots)
}

func (h *hostDraws) Close() error {
	h.settle()
	return h.Backend.Close()
}

var _ forward.AsyncDrawBackend = (*hostDraws)(nil)

func (h *hostDraws) DrawVocab() bool { return true }

func (h *hostDraws) RegisterMask(allowed []uint64) (int32, error) {
	h.settle()
	if len(h.masks) >= 64 {
		return -1, fmt.Errorf("forward: more than 64 draw masks")
	}
	h.masks = append(h.masks, append([]uint64(nil), allowed...))
	return int32(len(h.masks) - 1), nil
}

// Forward keeps Forward's own contract (and LogSumExp's).
func (h *hostDraws) Forward(b *forward.Batch, logits []float32) error {
	h.settle()
	if err := h.Backend.Forward(b, logits); err != nil {
		return err
	}
	h.setLSE(logits, len(b.LogitRows))
	return nil
}

func (h *hostDraws) setLSE(all []float32, R int) {
	V := h.VocabSize()
	h.lse = h.lse[:0]
	for i := range R {
		h.lse = append(h.lse, float32(sampler.LogSumExp(all[i*V:(i+1)*V])))
	}
}

func (h *hostDraws) LogSumExp() []float32 {
	h.settle()
	return h.lse
}

func (h *hostDraws) ForwardDraw(b *forward.Batch, draws []forward.Draw, out []forward.Drawn, hostRows []int32, logits []float32) error {
	h.settle()
	return h.forwardDraw(b, draws, out, hostRows, logits)
}

func (h *hostDraws) forwardDraw(b *forward.Batch, draws []forward.Draw, out []forward.Drawn, hostRows []int32, logits []float32) error {
	V, R := h.VocabSize(), len(b.LogitRows)
	if len(out) != len(draws) || len(logits) < len(hostRows)*V {
		return fmt.Errorf("forward: ForwardDraw with %d draws, %d results, %d host rows, %d logits", len(draws), len(out), len(hostRows), len(logits))
	}
	if cap(h.all) < R*V {
		h.all = make([]float32, R*V)
	}
	all := h.all[:R*V]
	if err := h.Backend.Forward(b, all); err != nil {
		return err
	}
	h.setLSE(all, R)
	for i, d := range draws {
		if d.Row < 0 || int(d.Row) >= R || int(d.Force) >= V || d.Mask < -1 || int(d.Mask) >= len(h.masks) || len(d.Exclude) > forward.MaxDrawExclude {
			return fmt.Errorf("forward: bad draw %d: %+v", i, d)
		}
		row := all[int(d.Row)*V : int(d.Row+1)*V]
		if d.Force >= 0 {
			out[i] = forward.Drawn{Tok: d.Force, Logit: row[d.Force]}
			continue
		}
		var mask []uint64
		if d.Mask >= 0 {
			mask = h.masks[d.Mask]
		}
		tok := sampler.DrawRow(row, mask, d.Exclude, sampler.DrawParams{Temperature: d.Temperature, TopP: d.TopP, MinP: d.MinP, TopK: d.TopK}, d.U)
		out[i] = forward.Drawn{Tok: tok}
		if tok >= 0 {
			out[i].Logit = row[tok]
		}
	}
	for k, r := range hostRows {
		if r < 0 || int(r) >= R {
			return fmt.Errorf("forward: host row %d out of [0,%d)", r, R)
		}
		copy(logits[k*V:(k+1)*V], all[int(r)*V:int(r+1)*V])
	}
	return nil
}

func (h *hostDraws) LaunchDraw(slot int, b *forward.Batch, draws []forward.Draw, hostRows []int32) error {
	if slot < 0 || slot > 1 || h.slots[slot].busy {
		return fmt.Errorf("forward: LaunchDraw on slot %d (busy or out of range)", slot)
	}
	h.settle()
	sl := &h.slots[slot]
	sl.busy = true
	done := make(chan struct{})
	sl.done, h.running = done, done
	go func() {
		defer close(done)
		V := h.VocabSize()
		sl.out = append(sl.out[:0], make([]forward.Drawn, len(draws))...)
		sl.logits = append(sl.logits[:0], make([]float32, len(hostRows)*V)...)
		sl.err = h.forwardDraw(b, draws, sl.out, hostRows, sl.logits)
		sl.lse = append(sl.lse[:0], h.lse...)
	}()
	return nil
}

func (h *hostDraws) WaitDraw(slot int, out []forward.Drawn, logits []float32, lse []float32) error {
	if slot < 0 || slot > 1 || !h.slots[slot].busy {
		return fmt.Errorf("forward: WaitDraw on slot %d without a launch", slot)
	}
	sl := &h.slots[slot]
	<-sl.done
	sl.busy = false
	if sl.err != nil {
		return sl.err
	}
	if len(out) != len(sl.out) || len(logits) != len(sl.logits) || len(lse) != len(sl.lse) {
		return fmt.Errorf("forward: WaitDraw slices %d/%d/%d, launch had %d/%d/%d", len(out), len(logits), len(lse), len(sl.out), len(sl.logits), len(sl.lse))
	}
	copy(out, sl.out)
	copy(logits, sl.logits)
	copy(lse, sl.lse)
	return nil
}
