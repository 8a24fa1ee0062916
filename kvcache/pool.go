// Package kvcache is the block manager of the paged KV cache, in the manner of
// vLLM v1: a BlockPool of fixed-size physical blocks (free list in LRU order,
// reference counts, and a hash → block map for automatic prefix caching) and a
// Manager that keeps each sequence's block table on top of it.
//
// Nothing here touches cache memory: the forward.Backend owns the K/V arrays
// and this package only decides which block holds which tokens. Neither type
// is safe for concurrent use; in chunlian the engine goroutine owns both.
package kvcache

import "fmt"

const none = -1

type block struct {
	ref    int32  // number of block tables holding this block
	hash   uint64 // prefix-chain hash, valid when cached
	cached bool   // registered in BlockPool.index under hash
	// plen is the number of leading tokens a cached block holds when it is
	// registered as a partial block (RegisterPartial), 0 for a full block.
	plen uint8
	// Free-list links (block ids; none at the ends). Only meaningful while
	// ref == 0, i.e. while the block is on the free list.
	prev, next int32
}

// BlockPool owns the physical block ids 0..n-1.
//
// Invariants (checked by CheckInvariants):
//   - a block is on the free list ⇔ its ref is 0;
//   - numFree equals the length of the free list;
//   - index.get(h) == id ⇔ blocks[id].cached && blocks[id].hash == h;
//   - a partial registration (plen > 0) is only made on a block nobody
//     will write into below plen (see Manager.Free and SnapshotTail).
//
// A freed block keeps its hash and stays findable through Lookup until Get
// evicts it for reuse. The free list is in eviction order: Get takes the
// head. Release appends a cached block at the tail (least recently freed
// cached blocks are evicted first) and puts an uncached one at the head:
// reusing it loses no cached prefix, and it is the block whose metadata is
// still in the CPU's cache (docs/DECISIONS.md, "Uncached blocks reused
// first").
type BlockPool struct {
	blocks     []block
	head, tail int32
	numFree    int
	index      blockIndex
}

// NewBlockPool returns a pool of n free blocks.
func NewBlockPool(n int) *BlockPool {
	p := &BlockPool{blocks: make([]block, n), head: none, tail: none, index: newBlockIndex(n)}
	for i := range p.blocks {
		p.pushTail(int32(i))
	}
	return p
}

// NumBlocks is the pool's size; NumFree the number of unreferenced blocks
// (cached or not: cached free blocks are evictable).
func (p *BlockPool) NumBlocks() int { return len(p.blocks) }
func (p *BlockPool) NumFree() int   { return p.numFree }

// NumCached is the number of blocks findable by hash (referenced or free).
func (p *BlockPool) NumCached() int { return p.index.n }

// RefCount returns the number of holders of block id.
func (p *BlockPool) RefCount(id int32) int { return int(p.blocks[id].ref) }

func (p *BlockPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.prev, b.next = p.tail, none
	if p.tail != none {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.numFree++
}

func (p *BlockPool) pushHead(id int32) {
	b := &p.blocks[id]
	b.prev, b.next = none, p.head
	if p.head != none {
		p.blocks[p.head].prev = id
	} else {
		p.tail = id
	}
	p.head = id
	p.numFree++
}

func (p *BlockPool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev != none {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next != none {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next = none, none
	p.numFree--
}

// Get takes the free list's head (the last uncached block freed, else the
// least recently freed cached one), evicting its cached hash, and returns
// it with ref 1. ok is false when no block is free.
func (p *BlockPool) Get() (id int32, ok bool) {
	if p.head == none {
		return 0, false
	}
	id = p.head
	p.unlink(id)
	p.Unregister(id)
	p.blocks[id].ref = 1
	return id, true
}

// Acquire adds a holder to block id, taking it off the free list if needed
// (a prefix-cache hit on a freed block).
func (p *BlockPool) Acquire(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 {
		p.unlink(id)
	}
	b.ref++
}

// Release drops a holder. At zero a cached block goes to the free-list
// tail, keeping its hash so that it can still be found until evicted; an
// uncached one goes to the head, to be reused first.
func (p *BlockPool) Release(id int32) {
	b := &p.blocks[id]
	if b.ref <= 0 {
		panic(fmt.Sprintf("kvcache: release of free block %d", id))
	}
	b.ref--
	if b.ref == 0 {
		if b.cached {
			p.pushTail(id)
		} else {
			p.pushHead(id)
		}
	}
}

// Unregister takes block id out of the prefix cache (a no-op when it is
// not registered): its slots are about to be written again.
func (p *BlockPool) Unregister(id int32) {
	b := &p.blocks[id]
	if b.cached {
		p.index.del(b.hash, id)
		b.cached, b.plen = false, 0
	}
}

// Lookup finds the cached block holding the full block whose chain hash is h.
func (p *BlockPool) Lookup(h uint64) (int32, bool) {
	id, ok := p.index.get(p.blocks, h)
	if ok && p.blocks[id].plen != 0 {
		return 0, false // a partial block under a colliding hash
	}
	return id, ok
}

// LookupPartial finds the cached partial block holding exactly n leading
// tokens whose chain hash (HashBlock over those n tokens) is h.
func (p *BlockPool) LookupPartial(h uint64, n int) (int32, bool) {
	id, ok := p.index.get(p.blocks, h)
	if !ok || int(p.blocks[id].plen) != n {
		return 0, false
	}
	return id, true
}

// Register makes the full, referenced block id findable under h. When h is
// already registered (an identical block computed by another sequence at the
// same time) the existing entry wins and id stays uncached; Register reports
// whether id was registered.
func (p *BlockPool) Register(id int32, h uint64) bool {
	b := &p.blocks[id]
	if b.cached {
		return b.hash == h
	}
	if p.index.insert(p.blocks, h, id) != id {
		return false
	}
	b.hash, b.cached, b.plen = h, true, 0
	return true
}

// RegisterPartial makes block id findable by LookupPartial(h, n): its first
// n tokens (0 < n < 256) are those HashBlock hashed into h. The caller
// guarantees that nobody writes those n slots until Get hands the block out
// again (Get drops the registration). Like Register, an existing entry
// under h wins; it reports whether id was registered.
func (p *BlockPool) RegisterPartial(id int32, h uint64, n int) bool {
	if n <= 0 || n > 255 {
		panic(fmt.Sprintf("kvcache: partial registration of %d tokens", n))
	}
	b := &p.blocks[id]
	if b.cached {
		return b.hash == h && int(b.plen) == n
	}
	if p.index.insert(p.blocks, h, id) != id {
		return false
	}
	b.hash, b.cached, b.plen = h, true, uint8(n)
	return true
}

// CheckInvariants verifies the pool's internal consistency and that
// refs[id] (the number of block tables holding id, as counted by the caller;
// nil to skip) equals each block's ref count.
func (p *BlockPool) CheckInvariants(refs []int) error {
	onList := make([]bool, len(p.blocks))
	n := 0
	prev := int32(none)
	for id := p.head; id != none; id = p.blocks[id].next {
		if onList[id] {
			return fmt.Errorf("free list loops at block %d", id)
		}
		if p.blocks[id].prev != prev {
			return fmt.Errorf("block %d: prev link %d, want %d", id, p.blocks[id].prev, prev)
		}
		onList[id] = true
		prev = id
		n++
	}
	if prev != p.tail {
		return fmt.Errorf("free list tail %d, walked to %d", p.tail, prev)
	}
	if n != p.numFree {
		return fmt.Errorf("numFree %d, free list holds %d", p.numFree, n)
	}
	for id := range p.blocks {
		b := &p.blocks[id]
		if b.ref < 0 {
			return fmt.Errorf("block %d: negative ref %d", id, b.ref)
		}
		if onList[id] != (b.ref == 0) {
			return fmt.Errorf("block %d: ref %d but on free list = %v", id, b.ref, onList[id])
		}
		if refs != nil && int(b.ref) != refs[id] {
			return fmt.Errorf("block %d: ref %d but held by %d block tables", id, b.ref, refs[id])
		}
		if b.cached {
			if got, ok := p.index.get(p.blocks, b.hash); !ok || got != int32(id) {
				return fmt.Errorf("block %d cached under %x but the index says %d,%v", id, b.hash, got, ok)
			}
		}
	}
	n = 0
	for _, e := range p.index.slots {
		if e.id == none {
			continue
		}
		n++
		if b := &p.blocks[e.id]; !b.cached || indexTag(b.hash) != e.tag {
			return fmt.Errorf("index entry %x → %d not matched by the block", e.tag, e.id)
		}
	}
	if n != p.index.n {
		return fmt.Errorf("index counts %d entries, holds %d", p.index.n, n)
	}
	return p.index.check()
}

// blockIndex maps a chain hash to the block registered under it, in place
// of a Go map: the pool's registrations are a large, churning set (every
// computed block, until Get evicts it), and each operation costs the
// engine goroutine a cache miss or two (docs/DECISIONS.md, "The prefix
// cache's hash index"). Open addressing with linear probing over a
// power-of-two table of at least twice the pool's size (each block is
// registered under at most one hash, so the table never fills past half);
// deletion shifts the following run back, so no tombstones build up.
//
// A slot holds 8 bytes: the block id and a 32-bit tag, the top half of h
// times a Fibonacci constant (FNV's low bits alone are not uniform
// enough). The tag's top bits are the home slot; a tag match is confirmed
// against the block's own hash (blocks[id].hash), which the pool keeps for
// every registered block, so the index needs no copy of h.
type blockIndex struct {
	slots []indexSlot
	shift uint // 32 - log2(len(slots)): home = tag >> shift
	n     int  // entries
}

type indexSlot struct {
	tag uint32
	id  int32 // none: empty
}

func newBlockIndex(numBlocks int) blockIndex {
	size, bits := 16, uint(4)
	for size < 2*numBlocks {
		size, bits = size*2, bits+1
	}
	if bits > 32 {
		panic(fmt.Sprintf("kvcache: %d blocks are too many for the index", numBlocks))
	}
	x := blockIndex{slots: make([]indexSlot, size), shift: 32 - bits}
	for i := range x.slots {
		x.slots[i].id = none
	}
	return x
}

// indexTag is h's tag (see blockIndex).
func indexTag(h uint64) uint32 { return uint32((h * 0x9E3779B97F4A7C15) >> 32) }

func (x *blockIndex) home(tag uint32) int { return int(tag >> x.shift) }

// get returns the block registered under h; blocks holds every registered
// block's hash.
func (x *blockIndex) get(blocks []block, h uint64) (int32, bool) {
	id, i := x.find(blocks, h)
	return id, i < 0
}

// find looks h up: it returns (id, -1) when h is registered to id, else
// (none, i) with i the empty slot where h would go.
func (x *blockIndex) find(blocks []block, h uint64) (int32, int) {
	mask := len(x.slots) - 1
	t := indexTag(h)
	for i := x.home(t); ; i = (i + 1) & mask {
		e := x.slots[i]
		if e.id == none {
			return none, i
		}
		if e.tag == t && blocks[e.id].hash == h {
			return e.id, -1
		}
	}
}

// insert registers id under h unless h is registered already; it returns
// the block registered under h afterwards (id, or the one that was there).
// The caller sets blocks[id].hash = h when id is returned.
func (x *blockIndex) insert(blocks []block, h uint64, id int32) int32 {
	got, i := x.find(blocks, h)
	if i < 0 {
		return got
	}
	x.slots[i] = indexSlot{indexTag(h), id}
	x.n++
	return id
}

// del removes block id, registered under h, moving back every later entry
// of its run that may move (Knuth's algorithm R for linear probing). It is
// a no-op when id is not there.
func (x *blockIndex) del(h uint64, id int32) {
	mask := len(x.slots) - 1
	i := x.home(indexTag(h))
	for {
		if x.slots[i].id == none {
			return
		}
		if x.slots[i].id == id {
			break
		}
		i = (i + 1) & mask
	}
	x.n--
	for j := (i + 1) & mask; x.slots[j].id != none; j = (j + 1) & mask {
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j].
		k := x.home(x.slots[j].tag)
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = indexSlot{id: none}
}

// check verifies that every entry is reachable from its home slot (no
// empty slot between them).
func (x *blockIndex) check() error {
	mask := len(x.slots) - 1
	for i, e := range x.slots {
		if e.id == none {
			continue
		}
		for k := x.home(e.tag); k != i; k = (k + 1) & mask {
			if x.slots[k].id == none {
				return fmt.Errorf("index entry %x → %d at slot %d unreachable: slot %d is empty", e.tag, e.id, i, k)
			}
		}
	}
	return nil
}

// HashBlock returns the chain hash of a full block: FNV-1a (64-bit) over the
// parent block's hash (0 for the first block) followed by the block's token
// ids, all little-endian. Two different prefixes share a hash only by a 64-bit
// collision; among a million distinct cached blocks the chance of any
// collision is about 3e-8, which we accept (as vLLM did with Python's hash
// before offering sha256). A collision would make a request reuse another
// prompt's K/V for one block, degrading that output, never crashing.
func HashBlock(parent uint64, tokens []int32) uint64 {
	// FNV-1a written out to avoid hash.Hash64's allocation on the hot path.
	h := fnvStart(parent)
	for _, t := range tokens {
		h = fnvToken(h, t)
	}
	return h
}

const fnvOffset, fnvPrime = 14695981039346656037, 1099511628211

// fnvStart is the FNV-1a state after the parent hash's 8 bytes.
func fnvStart(parent uint64) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < 8; i++ {
		h ^= parent >> (8 * i) & 0xff
		h *= fnvPrime
	}
	return h
}

// fnvToken feeds one token id's 4 little-endian bytes into state h.
func fnvToken(h uint64, t int32) uint64 {
	u := uint32(t)
	for i := 0; i < 4; i++ {
		h ^= uint64(u>>(8*i)) & 0xff
		h *= fnvPrime
	}
	return h
}
