package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"chunlian/forward"
)

// fakeBackend is a forward.Backend whose "K/V" per slot is the token and
// position written there, and whose logits for a row are a pseudo-random
// function of the row's whole context read back through the block table.
// So any wrong slot mapping, stale block, bad copy-on-write or bad prefix
// hit shows up as an error or as different tokens from the naive engine.
type fakeBackend struct {
	numBlocks, bs, vocab int
	tok, pos             []int32 // [numBlocks*bs] per slot; pos -1 = never written

	// gate, when non-nil, is received from at the start of every Forward
	// (tests use it to hold the engine inside a step).
	gate    chan struct{}
	entered chan struct{} // if non-nil, sent to (non-blocking) on Forward entry

	mu       sync.Mutex // guards the counters, read by tests
	forwards int
	copies   int
	failAt   int // if > 0, the failAt-th Forward call returns errInjected
}

var errInjected = fmt.Errorf("fake: injected failure")

func newFake(numBlocks, bs, vocab int) *fakeBackend {
	f := &fakeBackend{numBlocks: numBlocks, bs: bs, vocab: vocab, tok: make([]int32, numBlocks*bs), pos: make([]int32, numBlocks*bs)}
	for i := range f.pos {
		f.pos[i] = -1
	}
	return f
}

func (f *fakeBackend) NumBlocks() int { return f.numBlocks }
func (f *fakeBackend) BlockSize() int { return f.bs }
func (f *fakeBackend) VocabSize() int { return f.vocab }
func (f *fakeBackend) Close() error   { return nil }

// CopyBlocks copies the slots the engine names and poisons the rest of each
// destination block, so that a slot count short of the tokens a sequence
// reads shows up as a context mismatch in Forward.
func (f *fakeBackend) CopyBlocks(src, dst, slots []int32) error {
	if len(src) != len(dst) || len(src) != len(slots) {
		return fmt.Errorf("fake: %d src, %d dst, %d slot counts", len(src), len(dst), len(slots))
	}
	for i := range src {
		n := int(slots[i])
		if n < 1 || n > f.bs {
			return fmt.Errorf("fake: %d slots of a %d-slot block", n, f.bs)
		}
		d, s := int(dst[i])*f.bs, int(src[i])*f.bs
		copy(f.tok[d:d+n], f.tok[s:s+n])
		copy(f.pos[d:d+n], f.pos[s:s+n])
		for j := d + n; j < d+f.bs; j++ {
			f.tok[j], f.pos[j] = -1, -1
		}
	}
	f.mu.Lock()
	f.copies += len(src)
	f.mu.Unlock()
	return nil
}

func (f *fakeBackend) Forward(b *forward.Batch, logits []float32) error {
	if f.entered != nil {
		select {
		case f.entered <- struct{}{}:
		default:
		}
	}
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	f.forwards++
	fail := f.forwards == f.failAt
	f.mu.Unlock()
	if fail {
		return errInjected
	}
	T := len(b.Tokens)
	if len(b.Positions) != T || len(b.SlotMapping) != T || len(logits) != len(b.LogitRows)*f.vocab {
		return fmt.Errorf("fake: batch shapes T=%d pos=%d slots=%d logits=%d rows=%d", T, len(b.Positions), len(b.SlotMapping), len(logits), len(b.LogitRows))
	}
	written := map[int32]bool{}
	spanOf := make([]int, T)
	next := 0
	for si, sp := range b.Seqs {
		if sp.Start != next || sp.Len < 1 || sp.CtxLen < sp.Len {
			return fmt.Errorf("fake: span %d %+v not contiguous/valid", si, sp)
		}
		next += sp.Len
		if len(sp.BlockTable)*f.bs < sp.CtxLen {
			return fmt.Errorf("fake: span %d table too short", si)
		}
		for j := 0; j < sp.Len; j++ {
			i := sp.Start + j
			p := int32(sp.CtxLen - sp.Len + j)
			if b.Positions[i] != p {
				return fmt.Errorf("fake: token %d position %d want %d", i, b.Positions[i], p)
			}
			slot := b.SlotMapping[i]
			if want := sp.BlockTable[int(p)/f.bs]*int32(f.bs) + p%int32(f.bs); slot != want {
				return fmt.Errorf("fake: token %d slot %d, block table says %d", i, slot, want)
			}
			if written[slot] {
				return fmt.Errorf("fake: slot %d written twice in one batch", slot)
			}
			written[slot] = true
			f.tok[slot], f.pos[slot] = b.Tokens[i], p
			spanOf[i] = si
		}
	}
	if next != T {
		return fmt.Errorf("fake: spans cover %d of %d tokens", next, T)
	}
	for k, row := range b.LogitRows {
		sp := b.Seqs[spanOf[row]]
		p := int(b.Positions[row])
		ctx := make([]int32, p+1)
		for q := 0; q <= p; q++ {
			slot := sp.BlockTable[q/f.bs]*int32(f.bs) + int32(q%f.bs)
			if f.pos[slot] != int32(q) {
				return fmt.Errorf("fake: row %d reads slot %d holding position %d, want %d", row, slot, f.pos[slot], q)
			}
			ctx[q] = f.tok[slot]
		}
		fakeLogits(ctx, logits[k*f.vocab:(k+1)*f.vocab])
	}
	return nil
}

// fakeLogits fills out with a pseudo-random function of the context.
func fakeLogits(ctx []int32, out []float32) {
	h := uint64(14695981039346656037)
	for _, t := range ctx {
		h ^= uint64(uint32(t))
		h *= 1099511628211
	}
	r := rand.New(rand.NewPCG(h, 7))
	for i := range out {
		out[i] = 3 * r.Float32()
	}
}

func negInf() float64 { return math.Inf(-1) }
