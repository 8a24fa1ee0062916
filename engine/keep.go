package engine

import (
	"slices"

	"chunlian/kvcache"
)

// Kept samples (Request.Keep, Request.From, Keeper). A kept sample's
// sequence stays in the KV manager after its request completed, under a
// handle; a request that names the handle in From takes the sequence
// over at admission (its ID and blocks), truncated to the tokens whose K/V
// were computed, and computes only the rest of its prompt. At most
// MaxNumSeqs samples are kept: beyond that, and whenever blocks run
// short, the oldest go first, and their continuations fall back to the
// prefix cache. A continuation takes its sample over when it is
// submitted; while it waits, blocks short give those back too (after the
// kept ones, before a running sequence is preempted).

var _ Keeper = (*Paged)(nil)

// keptSeq is one kept sample: its sequence ID in the manager, its tokens
// (prompt and generated) and how many of them are computed.
type keptSeq struct {
	id       kvcache.SeqID
	tokens   []int32
	computed int
}

// Release implements Keeper.
func (e *Paged) Release(hs ...Handle) {
	e.relMu.Lock()
	e.released = append(e.released, hs...)
	e.relMu.Unlock()
	select {
	case e.relWake <- struct{}{}:
	default: // a wake is already pending
	}
}

// freeReleased frees the caches Release was given since the last call.
func (e *Paged) freeReleased() {
	e.relMu.Lock()
	hs := e.released
	e.released = nil
	e.relMu.Unlock()
	for _, h := range hs {
		e.dropKept(h)
	}
}

// keep holds finished sequence s's cache under a new handle.
func (e *Paged) keep(s *sequence) Handle {
	if e.kept == nil {
		e.kept = map[Handle]keptSeq{}
	}
	e.lastKept++
	h := e.lastKept
	e.kept[h] = keptSeq{id: s.id, tokens: s.tokens, computed: s.numComputed}
	e.keptOrder = append(e.keptOrder, h)
	for len(e.kept) > e.cfg.MaxNumSeqs {
		e.dropOldestKept()
	}
	return h
}

// dropKept frees the cache kept under h, if any.
func (e *Paged) dropKept(h Handle) {
	k, ok := e.kept[h]
	if !ok {
		return
	}
	delete(e.kept, h)
	e.mgr.Free(k.id)
	e.freeIDs = append(e.freeIDs, k.id)
	if len(e.keptOrder) > 2*len(e.kept)+64 { // forget spent handles
		e.keptOrder = slices.DeleteFunc(e.keptOrder, func(h Handle) bool { _, ok := e.kept[h]; return !ok })
	}
}

// dropOldestKept frees the oldest kept cache; false when none is kept.
func (e *Paged) dropOldestKept() bool {
	for len(e.keptOrder) > 0 {
		h := e.keptOrder[0]
		e.keptOrder = e.keptOrder[1:]
		if _, ok := e.kept[h]; ok {
			e.dropKept(h)
			e.keptDropped++
			return true
		}
	}
	return false
}

// dropAdopted frees the blocks of the last waiting sequence other than
// except that took a kept sample over: it computes its prompt instead,
// like a preempted one. Without this, waiting sequences holding adopted
// blocks could starve the head of the queue, or make a running sequence
// preempt itself at every step. false when none holds any.
func (e *Paged) dropAdopted(except *sequence) bool {
	for i := len(e.waiting) - 1; i >= 0; i-- {
		if s := e.waiting[i]; s.adopted > 0 && s != except {
			e.mgr.Free(s.id)
			s.adopted = 0
			e.keptDropped++
			return true
		}
	}
	return false
}

// adopt makes prompt sequence s take over the sample kept under h when
// its prompt extends that sample's computed tokens (and the request does
// not ask for prompt log-probs, whose rows would be skipped): s gets the
// kept ID and blocks, and admission computes only the rest.
func (e *Paged) adopt(s *sequence, h Handle) {
	k, ok := e.kept[h]
	p := s.r.req.Prompt
	if !ok || s.r.req.PromptLogProbs || k.computed <= 0 || len(p) <= k.computed || !slices.Equal(p[:k.computed], k.tokens[:k.computed]) {
		return
	}
	delete(e.kept, h)
	e.freeIDs = append(e.freeIDs, s.id)
	s.id, s.adopted = k.id, k.computed
}
