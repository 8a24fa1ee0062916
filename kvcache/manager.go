package kvcache

import (
	"fmt"
	"math"
)

// SeqID names a sequence inside a Manager: a small non-negative integer.
// The manager indexes a slice by it, so its memory grows with the largest
// live ID; callers reuse the IDs of freed sequences (the engine does).
type SeqID int64

type seqState struct {
	blocks []int32 // block table: logical block i → physical block id
	// slots is the number of token slots reserved so far (positions
	// 0..slots-1 have a slot); len(blocks) == ceil(slots/blockSize).
	slots int
	// hashes[i] is the chain hash of full block i, for i < len(hashes). A
	// block is hashed once its tokens are all computed (CacheBlocks).
	hashes []uint64
	// computed and toks are what the last CacheBlocks call said: the K/V of
	// toks[:computed] are in the cache. The caller never changes those
	// tokens (it only appends), so keeping its slice is safe; Free and
	// SnapshotTail read the tokens of the partial last block from it.
	computed int
	toks     []int32
	// limit bounds what CacheBlocks and Free register: only blocks whose
	// tokens all lie below it (SetCacheLimit; no bound by default).
	limit int
}

// Manager keeps the block table of every live sequence on top of a
// BlockPool. Not safe for concurrent use (the engine goroutine owns it).
//
// Invariant: every block in any block table has ref ≥ 1 and its ref equals
// the number of block tables holding it; blocks in no table are free.
type Manager struct {
	pool      *BlockPool
	blockSize int
	caching   bool
	seqs      []*seqState // by SeqID; nil: not live
	live      int         // non-nil entries of seqs
	// copies pending copy-on-write: the backend must copy the first
	// copySlots[i] slots of copySrc[i] → copyDst[i] before the next forward
	// pass (TakeCopies).
	copySrc, copyDst, copySlots []int32
	fill                        []int // [numBlocks] scratch of Usage: live slots per block
	// hitBlocks and hitHashes are ComputedBlocks' result storage.
	hitBlocks []int32
	hitHashes []uint64
}

// NewManager returns a manager over numBlocks blocks of blockSize tokens.
// With caching false, ComputedBlocks never hits and no block is registered.
func NewManager(numBlocks, blockSize int, caching bool) *Manager {
	if numBlocks <= 0 || blockSize <= 0 {
		panic(fmt.Sprintf("kvcache: bad manager size %d blocks × %d", numBlocks, blockSize))
	}
	return &Manager{pool: NewBlockPool(numBlocks), blockSize: blockSize, caching: caching}
}

func (m *Manager) Pool() *BlockPool   { return m.pool }
func (m *Manager) BlockSize() int     { return m.blockSize }
func (m *Manager) Caching() bool      { return m.caching }
func (m *Manager) NumSeqs() int       { return m.live }
func (m *Manager) Has(seq SeqID) bool { return m.seq(seq) != nil }

// seq returns seq's state, nil when it is not live.
func (m *Manager) seq(seq SeqID) *seqState {
	if seq < 0 || seq >= SeqID(len(m.seqs)) {
		return nil
	}
	return m.seqs[seq]
}

// put makes s the state of seq (not live before).
func (m *Manager) put(seq SeqID, s *seqState) {
	if seq < 0 {
		panic(fmt.Sprintf("kvcache: negative seq %d", seq))
	}
	for SeqID(len(m.seqs)) <= seq {
		m.seqs = append(m.seqs, nil)
	}
	m.seqs[seq] = s
	m.live++
}

// BlockTable returns seq's block table (nil for an unknown seq). The slice is
// the manager's own: read it, don't keep it past the next Allocate/Free.
func (m *Manager) BlockTable(seq SeqID) []int32 {
	if s := m.seq(seq); s != nil {
		return s.blocks
	}
	return nil
}

// Slots is the number of token slots reserved for seq.
func (m *Manager) Slots(seq SeqID) int {
	if s := m.seq(seq); s != nil {
		return s.slots
	}
	return 0
}

// Slot returns the cache slot (block*blockSize + offset) of position pos of
// seq; pos must be below Slots(seq).
func (m *Manager) Slot(seq SeqID, pos int) int32 {
	s := m.seq(seq)
	return SlotIn(s.blocks, m.blockSize, pos)
}

// SlotIn is the cache slot of position pos of a sequence whose block table
// is table: block table[pos/blockSize], offset pos%blockSize. Callers
// that lay out many positions of one sequence take its BlockTable once
// and use this (the engine's buildBatch).
func SlotIn(table []int32, blockSize, pos int) int32 {
	return table[pos/blockSize]*int32(blockSize) + int32(pos%blockSize)
}

// Computed is the result of a prefix-cache lookup: the cached full blocks
// holding the longest known prefix of a token sequence and their hashes,
// then possibly a cached block whose first PartialLen tokens continue that
// prefix (PartialLen 0: none). The partial block is never shared: Allocate
// copies it into a block of the new sequence's own.
type Computed struct {
	Blocks       []int32
	Hashes       []uint64
	PartialBlock int32
	PartialLen   int
}

// Tokens is the number of prompt tokens the hit covers.
func (c Computed) Tokens(blockSize int) int { return len(c.Blocks)*blockSize + c.PartialLen }

// ComputedBlocks looks up the longest cached prefix of tokens: full blocks
// by their chain hashes, then the longest run of the next tokens that a
// cached block starts with (a partial block left by Free or SnapshotTail,
// or a full block whose tokens are all the prompt has left). At least one
// token is always left uncovered, because the last prompt token must be run
// to get the logits to sample from (vLLM does the same). It takes no
// references: pass the result to Allocate in the same step, before any
// other Allocate could evict the blocks. The result's slices are the
// manager's scratch (Allocate copies them): they hold until the next
// ComputedBlocks call.
func (m *Manager) ComputedBlocks(tokens []int32) Computed {
	var c Computed
	if !m.caching {
		return c
	}
	bs := m.blockSize
	var parent uint64
	c.Blocks, c.Hashes = m.hitBlocks[:0], m.hitHashes[:0]
	for i := 0; (i+1)*bs <= len(tokens)-1; i++ {
		h := HashBlock(parent, tokens[i*bs:(i+1)*bs])
		id, ok := m.pool.Lookup(h)
		if !ok {
			break
		}
		c.Blocks = append(c.Blocks, id)
		c.Hashes = append(c.Hashes, h)
		parent = h
	}
	m.hitBlocks, m.hitHashes = c.Blocks, c.Hashes // keep what the scratch grew to
	// The partial step: hashes of every prefix of the rest (up to a block),
	// longest match first. A match on all that is left gives back its last
	// token (recomputed for the logits).
	rest := tokens[len(c.Blocks)*bs:]
	n := min(bs, len(rest))
	if n == 0 || n > maxPartial {
		return c
	}
	var hs [maxPartial]uint64
	hashPrefixes(parent, rest[:n], hs[:n])
	for k := n; k >= 1; k-- {
		var id int32
		var ok bool
		if k == bs {
			id, ok = m.pool.Lookup(hs[k-1])
		} else {
			id, ok = m.pool.LookupPartial(hs[k-1], k)
		}
		if ok {
			if use := min(k, len(rest)-1); use > 0 {
				c.PartialBlock, c.PartialLen = id, use
			}
			break
		}
	}
	return c
}

// maxPartial bounds the block sizes for which partial blocks are cached (a
// stack array of prefix hashes; RegisterPartial stores the length in a byte).
const maxPartial = 255

// hashPrefixes sets out[k-1] = HashBlock(parent, toks[:k]) for every k in
// 1..len(toks), in one pass (FNV-1a is a running hash).
func hashPrefixes(parent uint64, toks []int32, out []uint64) {
	h := fnvStart(parent)
	for k, t := range toks {
		h = fnvToken(h, t)
		out[k] = h
	}
}

// growBlocks is the room a new block table (and its hashes) gets beyond
// what it holds: a couplet's sequence grows by 15-20 tokens after
// admission, so at small blocks its table would otherwise be reallocated
// several times while it decodes.
const growBlocks = 16

// grown returns a copy of s with room for n + growBlocks elements.
func grown[T any](s []T, n int) []T {
	return append(make([]T, 0, max(n, len(s))+growBlocks), s...)
}

// blocksFor is the number of blocks holding n tokens.
func (m *Manager) blocksFor(n int) int { return (n + m.blockSize - 1) / m.blockSize }

// Allocate reserves slots for numNew more tokens of seq. A seq not yet known
// is admitted first with the prefix-cache hit computed (from ComputedBlocks;
// zero for none): its block table starts with those blocks and its slots with
// their tokens. When appending into a partial last block that other
// sequences share (after Fork), the block is copied first (copy-on-write; see
// TakeCopies). It returns false, changing nothing, when the pool lacks free
// blocks; the caller then preempts someone and retries.
func (m *Manager) Allocate(seq SeqID, numNew int, computed Computed) bool {
	s := m.seq(seq)
	isNew := s == nil
	slots, have := 0, 0
	needExtra := 0 // free blocks the computed hit takes off the free list
	if isNew {
		slots = computed.Tokens(m.blockSize)
		have = len(computed.Blocks)
		for _, id := range computed.Blocks {
			if m.pool.RefCount(id) == 0 {
				needExtra++
			}
		}
		if computed.PartialLen > 0 && m.pool.RefCount(computed.PartialBlock) == 0 {
			needExtra++ // held off the free list while its copy is taken
		}
	} else {
		slots, have = s.slots, len(s.blocks)
	}
	need := m.blocksFor(slots+numNew) - have
	cow := !isNew && numNew > 0 && slots%m.blockSize != 0 && m.pool.RefCount(s.blocks[len(s.blocks)-1]) > 1
	if cow {
		need++
	}
	if need+needExtra > m.pool.NumFree() {
		return false
	}
	if isNew {
		s = &seqState{slots: slots, limit: math.MaxInt}
		for _, id := range computed.Blocks {
			m.pool.Acquire(id)
		}
		s.blocks = grown(computed.Blocks, m.blocksFor(slots+numNew))
		s.hashes = grown(computed.Hashes, len(computed.Blocks))
		m.put(seq, s)
		if computed.PartialLen > 0 {
			// The cached block stays as it is (others may hit it too);
			// the sequence gets a copy to write its next tokens into.
			// Acquire first so that Get cannot hand out the source itself.
			src := computed.PartialBlock
			m.pool.Acquire(src)
			dst, _ := m.pool.Get()
			m.copySrc = append(m.copySrc, src)
			m.copyDst = append(m.copyDst, dst)
			m.copySlots = append(m.copySlots, int32(computed.PartialLen))
			m.pool.Release(src)
			s.blocks = append(s.blocks, dst)
			need--
		}
	}
	if cow {
		last := len(s.blocks) - 1
		src := s.blocks[last]
		dst, _ := m.pool.Get()
		m.copySrc = append(m.copySrc, src)
		m.copyDst = append(m.copyDst, dst)
		m.copySlots = append(m.copySlots, int32(slots%m.blockSize))
		m.pool.Release(src)
		s.blocks[last] = dst
		need--
	}
	for ; need > 0; need-- {
		id, _ := m.pool.Get()
		s.blocks = append(s.blocks, id)
	}
	s.slots += numNew
	return true
}

// TakeCopies returns and clears the pending copy-on-write copies: block
// src[i]'s first slots[i] slots (the ones holding tokens, 1..BlockSize) go
// to dst[i]. The backend must run CopyBlocks(src, dst, slots) in order
// before the forward pass that writes into dst. The slices are reused by
// later calls.
func (m *Manager) TakeCopies() (src, dst, slots []int32) {
	src, dst, slots = m.copySrc, m.copyDst, m.copySlots
	m.copySrc, m.copyDst, m.copySlots = m.copySrc[:0], m.copyDst[:0], m.copySlots[:0]
	return src, dst, slots
}

// CacheBlocks records that the first numComputed tokens of seq (tokens holds
// at least that many) are now in the cache, and registers every newly full
// block under its chain hash so that later requests can reuse it.
func (m *Manager) CacheBlocks(seq SeqID, tokens []int32, numComputed int) {
	s := m.seq(seq)
	if !m.caching || s == nil {
		return
	}
	s.computed, s.toks = min(numComputed, s.slots), tokens
	full := min(s.computed, s.limit) / m.blockSize
	for i := len(s.hashes); i < full; i++ {
		var parent uint64
		if i > 0 {
			parent = s.hashes[i-1]
		}
		h := HashBlock(parent, tokens[i*m.blockSize:(i+1)*m.blockSize])
		s.hashes = append(s.hashes, h)
		m.pool.Register(s.blocks[i], h)
	}
}

// SetCacheLimit bounds the prefix cache's share of seq (and of the
// sequences forked from it from now on): only blocks whose tokens all lie
// below position n are registered. A request whose continuations keep its
// sequences (the engine's Request.Keep) needs no hash of what it
// generates, and registering and evicting those blocks is most of the
// cache's host work.
func (m *Manager) SetCacheLimit(seq SeqID, n int) {
	if s := m.seq(seq); s != nil {
		s.limit = max(n, 0)
	}
}

// Truncate drops seq's tokens from position n on (n ≤ Slots(seq)): blocks
// wholly past n go back to the pool, last first, and a partly kept last
// block leaves the prefix cache if it was registered (its slots from n on
// will be written again). Computed tokens past n are forgotten.
func (m *Manager) Truncate(seq SeqID, n int) {
	s := m.seq(seq)
	if s == nil || n >= s.slots {
		return
	}
	n = max(n, 0)
	keep := m.blocksFor(n)
	for i := len(s.blocks) - 1; i >= keep; i-- {
		m.pool.Release(s.blocks[i])
	}
	s.blocks = s.blocks[:keep]
	if n%m.blockSize != 0 {
		m.pool.Unregister(s.blocks[keep-1])
	}
	s.hashes = s.hashes[:min(len(s.hashes), n/m.blockSize)]
	s.slots, s.computed = n, min(s.computed, n)
}

// Fork makes child share every block of parent (n > 1 parallel sampling):
// same table, refs incremented. A later Allocate on either side copies a
// shared partial last block before writing into it.
func (m *Manager) Fork(parent, child SeqID) {
	p := m.seq(parent)
	if p == nil {
		panic(fmt.Sprintf("kvcache: fork of unknown seq %d", parent))
	}
	if m.seq(child) != nil {
		panic(fmt.Sprintf("kvcache: fork into live seq %d", child))
	}
	c := &seqState{slots: p.slots, blocks: grown(p.blocks, len(p.blocks)), hashes: grown(p.hashes, len(p.hashes)), computed: p.computed, toks: p.toks, limit: p.limit}
	for _, id := range c.blocks {
		m.pool.Acquire(id)
	}
	m.put(child, c)
}

// Free drops seq and releases its blocks, last block first so that the tail
// of a sequence (least likely to be shared as a prefix) is evicted first.
// When seq was the last holder of a partly computed last block, that block
// is registered as a partial block first, so that a later prompt that
// continues seq's computed tokens (a follow-up request, or seq itself
// readmitted after preemption) recomputes only what is new. Freeing an
// unknown seq is a no-op.
func (m *Manager) Free(seq SeqID) {
	s := m.seq(seq)
	if s == nil {
		return
	}
	if id, h, n, ok := m.tail(s); ok && m.pool.RefCount(id) == 1 {
		m.pool.RegisterPartial(id, h, n)
	}
	for i := len(s.blocks) - 1; i >= 0; i-- {
		m.pool.Release(s.blocks[i])
	}
	m.seqs[seq] = nil
	m.live--
}

// tail returns s's partly computed last block, the chain hash of its
// computed tokens and their number; ok is false when there is none (caching
// off, no CacheBlocks call yet, the computed tokens end on a block
// boundary, or the block is already registered).
func (m *Manager) tail(s *seqState) (id int32, h uint64, n int, ok bool) {
	bs := m.blockSize
	i, n := s.computed/bs, s.computed%bs
	if !m.caching || n == 0 || s.toks == nil || bs > maxPartial || len(s.hashes) < i || s.computed > s.limit {
		return 0, 0, 0, false
	}
	var parent uint64
	if i > 0 {
		parent = s.hashes[i-1]
	}
	return s.blocks[i], HashBlock(parent, s.toks[i*bs:s.computed]), n, true
}

// SnapshotTail caches a copy of seq's partly computed last block, which seq
// itself will go on writing into: a free block is taken, registered as
// that partial block and released, and a copy (TakeCopies) fills it before
// the next forward pass. It is meant for short prompts that are likely to
// come again (the engine calls it when a prompt shorter than a block is
// computed). Nothing happens when the tail is already cached or no block is
// free; evicting the free list's head for it is the price.
func (m *Manager) SnapshotTail(seq SeqID) {
	s := m.seq(seq)
	if s == nil {
		return
	}
	id, h, n, ok := m.tail(s)
	if !ok {
		return
	}
	if _, hit := m.pool.LookupPartial(h, n); hit {
		return
	}
	dst, got := m.pool.Get()
	if !got {
		return
	}
	m.copySrc = append(m.copySrc, id)
	m.copyDst = append(m.copyDst, dst)
	m.copySlots = append(m.copySlots, int32(n))
	m.pool.RegisterPartial(dst, h, n)
	m.pool.Release(dst)
}

// Usage describes how full the cache is.
type Usage struct {
	UsedBlocks, TotalBlocks int
	// LiveSlots counts distinct slots holding a live token (a slot of a
	// shared block counts once); AllocatedSlots = UsedBlocks × blockSize.
	// LiveSlots/AllocatedSlots is the memory-efficiency figure (vLLM's
	// "under 4% waste").
	LiveSlots, AllocatedSlots int
}

// Usage computes the current usage in O(total block-table length).
func (m *Manager) Usage() Usage {
	u := Usage{TotalBlocks: m.pool.NumBlocks(), UsedBlocks: m.pool.NumBlocks() - m.pool.NumFree()}
	u.AllocatedSlots = u.UsedBlocks * m.blockSize
	if len(m.fill) != m.pool.NumBlocks() {
		m.fill = make([]int, m.pool.NumBlocks())
	}
	fill := m.fill
	clear(fill)
	for _, s := range m.seqs {
		if s == nil {
			continue
		}
		for i, id := range s.blocks {
			f := min(m.blockSize, s.slots-i*m.blockSize)
			if f > fill[id] {
				u.LiveSlots += f - fill[id]
				fill[id] = f
			}
		}
	}
	return u
}

// CheckInvariants verifies the pool and that every block's ref count equals
// the number of block tables holding it.
func (m *Manager) CheckInvariants() error {
	refs := make([]int, m.pool.NumBlocks())
	for id, s := range m.seqs {
		if s == nil {
			continue
		}
		if len(s.blocks) != m.blocksFor(s.slots) {
			return fmt.Errorf("seq %d: %d blocks for %d slots", id, len(s.blocks), s.slots)
		}
		if len(s.hashes) > len(s.blocks) {
			return fmt.Errorf("seq %d: %d hashes for %d blocks", id, len(s.hashes), len(s.blocks))
		}
		for _, b := range s.blocks {
			refs[b]++
		}
	}
	return m.pool.CheckInvariants(refs)
}
