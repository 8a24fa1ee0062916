package kvcache

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestHashBlockIsFNV1a(t *testing.T) {
	cases := []struct {
		parent uint64
		toks   []int32
	}{
		{0, nil},
		{0, []int32{1, 2, 3, 4}},
		{0xdeadbeefcafef00d, []int32{-1, 0, 70000}},
	}
	for _, tc := range cases {
		h := fnv.New64a()
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], tc.parent)
		h.Write(b[:])
		for _, tk := range tc.toks {
			binary.LittleEndian.PutUint32(b[:4], uint32(tk))
			h.Write(b[:4])
		}
		if got, want := HashBlock(tc.parent, tc.toks), h.Sum64(); got != want {
			t.Errorf("HashBlock(%x, %v) = %x, want %x", tc.parent, tc.toks, got, want)
		}
	}
	if HashBlock(1, []int32{5}) == HashBlock(2, []int32{5}) {
		t.Error("parent hash ignored")
	}
}

func TestPoolLRUEviction(t *testing.T) {
	p := NewBlockPool(3)
	a, _ := p.Get()
	b, _ := p.Get()
	c, _ := p.Get()
	if _, ok := p.Get(); ok {
		t.Fatal("Get from an empty pool succeeded")
	}
	p.Register(a, 100)
	p.Register(b, 200)
	if p.Register(c, 100) {
		t.Error("duplicate hash registered twice")
	}
	// Free b then a, then c (never cached): c is reused first, since
	// reusing it evicts nothing; then b, the least recently freed cached
	// block.
	p.Release(b)
	p.Release(a)
	p.Release(c)
	if id, ok := p.Lookup(200); !ok || id != b {
		t.Fatalf("freed cached block not findable: %d %v", id, ok)
	}
	if got, _ := p.Get(); got != c {
		t.Fatalf("Get = %d, want the uncached block %d", got, c)
	}
	if id, ok := p.Lookup(200); !ok || id != b {
		t.Fatalf("reusing an uncached block evicted a cached one: %d %v", id, ok)
	}
	got, _ := p.Get()
	if got != b {
		t.Fatalf("evicted %d, want least recently freed %d", got, b)
	}
	if _, ok := p.Lookup(200); ok {
		t.Error("evicted block still findable")
	}
	// A hit on a free cached block takes it off the free list.
	p.Acquire(a)
	if p.NumFree() != 0 || p.RefCount(a) != 1 {
		t.Errorf("after acquire: free %d ref %d", p.NumFree(), p.RefCount(a))
	}
	// Uncached blocks come back last freed, first reused, ahead of the
	// cached a.
	p.Release(a)
	p.Release(b)
	p.Release(c)
	for _, want := range []int32{c, b, a} {
		if got, _ := p.Get(); got != want {
			t.Errorf("Get = %d, want %d", got, want)
		}
	}
	if err := p.CheckInvariants(nil); err != nil {
		t.Fatal(err)
	}
}

// sim is a model of the cache memory: the token stored in every slot,
// written through block tables exactly as a backend would.
type simSeq struct {
	id       SeqID
	tokens   []int32 // all tokens the sequence knows
	computed int     // tokens written into the cache
}

// TestRandomizedInvariants runs random mixes of admit (with prefix lookup),
// chunked prefill, decode, fork, finish, abort and preempt on a small pool,
// checking after every operation that the pool and tables are consistent and
// that every sequence reads its own tokens back through its block table
// (which catches wrong copy-on-write and wrong prefix hits). When all
// sequences end every block must be free.
func TestRandomizedInvariants(t *testing.T) {
	var hits, partial, copies int
	for seed := uint64(1); seed <= 60; seed++ {
		bs := []int{1, 2, 4, 16}[seed%4]
		numBlocks := 8 + int(seed%5)*6
		caching := seed%3 != 0
		h, p, c := runRandom(t, seed, bs, numBlocks, caching)
		hits += h
		partial += p
		copies += c
	}
	// The mix must really exercise prefix hits (partial ones too) and
	// copy-on-write.
	if hits == 0 || partial == 0 || copies == 0 {
		t.Errorf("random ops made %d prefix-hit tokens (%d from partial blocks) and %d copies", hits, partial, copies)
	}
	t.Logf("prefix-hit tokens %d (%d from partial blocks), block copies %d", hits, partial, copies)
}

func runRandom(t *testing.T, seed uint64, bs, numBlocks int, caching bool) (hits, partialHits, cowCopies int) {
	r := rand.New(rand.NewPCG(seed, 99))
	m := NewManager(numBlocks, bs, caching)
	mem := make([]int32, numBlocks*bs) // token per slot
	for i := range mem {
		mem[i] = -1
	}
	var live []*simSeq
	var next SeqID
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d bs %d blocks %d caching %v: "+format, append([]any{seed, bs, numBlocks, caching}, args...)...)
	}
	// write simulates a forward pass over positions [from, to) of s.
	write := func(s *simSeq, from, to int) {
		src, dst, slots := m.TakeCopies()
		for i := range src {
			// Only the named slots travel; the rest of the block is
			// poisoned, so a short count fails verify.
			n := int(slots[i])
			if n < 1 || n > bs {
				fail("copy of %d slots of a %d-slot block", n, bs)
			}
			copy(mem[int(dst[i])*bs:][:n], mem[int(src[i])*bs:][:n])
			for j := n; j < bs; j++ {
				mem[int(dst[i])*bs+j] = -1
			}
			cowCopies++
		}
		for p := from; p < to; p++ {
			mem[m.Slot(s.id, p)] = s.tokens[p]
		}
		s.computed = to
		m.CacheBlocks(s.id, s.tokens, to)
	}
	verify := func() {
		if err := m.CheckInvariants(); err != nil {
			fail("%v", err)
		}
		// Usage's live slots (stamped scratch, reused across calls) against
		// a fresh count: a block's live slots are the most any holder fills.
		most := map[int32]int{}
		for _, sq := range m.seqs {
			if sq == nil {
				continue
			}
			for i, id := range sq.blocks {
				most[id] = max(most[id], min(m.blockSize, sq.slots-i*m.blockSize))
			}
		}
		want := 0
		for _, f := range most {
			want += f
		}
		if u := m.Usage(); u.LiveSlots != want {
			fail("Usage: %d live slots, a fresh count gives %d", u.LiveSlots, want)
		}
		for _, s := range live {
			if m.Slots(s.id) < s.computed {
				fail("seq %d: %d slots < %d computed", s.id, m.Slots(s.id), s.computed)
			}
			for p := 0; p < s.computed; p++ {
				if got := mem[m.Slot(s.id, p)]; got != s.tokens[p] {
					fail("seq %d reads token %d at position %d, want %d", s.id, got, p, s.tokens[p])
				}
			}
		}
	}
	remove := func(i int) { live = slices.Delete(live, i, i+1) }
	prefixes := [][]int32{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, {7, 7, 7, 7, 7, 7, 7, 7, 7, 7}}
	for op := 0; op < 400; op++ {
		switch k := r.IntN(10); {
		case k < 3: // admit a new sequence, prefix lookup, first chunk
			n := 1 + r.IntN(2*bs+6)
			toks := make([]int32, n)
			for i := range toks {
				toks[i] = int32(r.IntN(3))
			}
			if r.IntN(2) == 0 {
				pre := prefixes[r.IntN(len(prefixes))]
				copy(toks, pre[:min(len(pre), n)])
			}
			next++
			s := &simSeq{id: next, tokens: toks}
			hit := m.ComputedBlocks(toks)
			if !caching && len(hit.Blocks) > 0 {
				fail("hit with caching off")
			}
			c := hit.Tokens(bs)
			if c >= n {
				fail("hit covers all %d tokens", n)
			}
			chunk := 1 + r.IntN(n-c)
			if !m.Allocate(s.id, chunk, hit) {
				if m.Has(s.id) {
					fail("failed Allocate admitted the seq")
				}
				continue
			}
			hits += c
			partialHits += hit.PartialLen
			s.computed = c
			live = append(live, s)
			write(s, c, c+chunk)
			if r.IntN(2) == 0 {
				m.SnapshotTail(s.id) // its copy runs with the next write
			}
		case k < 6 && len(live) > 0: // continue prefill or decode one token
			s := live[r.IntN(len(live))]
			if s.computed == len(s.tokens) {
				s.tokens = append(s.tokens, int32(r.IntN(3)))
			}
			n := 1 + r.IntN(len(s.tokens)-s.computed)
			if m.Allocate(s.id, n, Computed{}) {
				write(s, s.computed, s.computed+n)
			}
		case k < 7 && len(live) > 0: // fork a fully computed sequence
			s := live[r.IntN(len(live))]
			if s.computed != len(s.tokens) || m.Slots(s.id) != s.computed {
				continue
			}
			next++
			c := &simSeq{id: next, tokens: slices.Clone(s.tokens), computed: s.computed}
			m.Fork(s.id, c.id)
			live = append(live, c)
		case k < 9 && len(live) > 0: // finish or abort
			i := r.IntN(len(live))
			m.Free(live[i].id)
			remove(i)
		case len(live) > 0: // preempt: free now, readmit later by recompute
			i := r.IntN(len(live))
			s := live[i]
			m.Free(s.id)
			remove(i)
			hit := m.ComputedBlocks(s.tokens)
			c := hit.Tokens(bs)
			partialHits += hit.PartialLen
			s2 := &simSeq{id: s.id, tokens: s.tokens}
			if m.Allocate(s2.id, len(s.tokens)-c, hit) {
				live = append(live, s2)
				s2.computed = c
				write(s2, c, len(s.tokens))
			}
		}
		verify()
	}
	for _, s := range live {
		m.Free(s.id)
	}
	live = nil
	verify()
	if m.Pool().NumFree() != numBlocks {
		fail("%d of %d blocks free at the end", m.Pool().NumFree(), numBlocks)
	}
	if u := m.Usage(); u.UsedBlocks != 0 || u.LiveSlots != 0 {
		fail("usage at the end %+v", u)
	}
	return hits, partialHits, cowCopies
}

// TestForkCopyOnWrite walks the n>1 case by hand.
func TestForkCopyOnWrite(t *testing.T) {
	m := NewManager(10, 4, true)
	toks := []int32{1, 2, 3, 4, 5, 6} // one full block + 2 tokens
	if !m.Allocate(1, 6, Computed{}) {
		t.Fatal("allocate")
	}
	m.CacheBlocks(1, toks, 6)
	m.Fork(1, 2)
	m.Fork(1, 3)
	if got := m.Pool().NumBlocks() - m.Pool().NumFree(); got != 2 {
		t.Fatalf("%d blocks used after fork, want 2 shared", got)
	}
	full, partial := m.BlockTable(1)[0], m.BlockTable(1)[1]
	// Each of three samples appends one token into the shared partial block:
	// the first two copy it, the last one owns it alone and writes in place.
	for i, seq := range []SeqID{2, 3, 1} {
		if !m.Allocate(seq, 1, Computed{}) {
			t.Fatal("allocate")
		}
		src, dst, slots := m.TakeCopies()
		wantCopies := 1
		if i == 2 {
			wantCopies = 0
		}
		if len(src) != wantCopies {
			t.Fatalf("seq %d: %d copies, want %d", seq, len(src), wantCopies)
		}
		if wantCopies == 1 && (src[0] != partial || dst[0] != m.BlockTable(seq)[1] || slots[0] != 2) {
			t.Errorf("seq %d: copy %d→%d of %d slots, table %v; want the 2 slots of the shared partial block", seq, src[0], dst[0], slots[0], m.BlockTable(seq))
		}
		if m.BlockTable(seq)[0] != full {
			t.Errorf("seq %d: full block not shared", seq)
		}
	}
	if m.BlockTable(1)[1] != partial {
		t.Error("last writer did not keep the original block")
	}
	if m.Pool().RefCount(full) != 3 || m.Pool().RefCount(partial) != 1 {
		t.Errorf("refs full %d partial %d", m.Pool().RefCount(full), m.Pool().RefCount(partial))
	}
	if u := m.Usage(); u.UsedBlocks != 4 || u.LiveSlots != 4+3*3 || u.AllocatedSlots != 16 {
		t.Errorf("usage %+v", u)
	}
	if err := m.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []SeqID{1, 2, 3} {
		m.Free(s)
	}
	if m.Pool().NumFree() != 10 {
		t.Errorf("%d free", m.Pool().NumFree())
	}
	// The full block stays findable after everyone left.
	if hit := m.ComputedBlocks(toks); len(hit.Blocks) != 1 || hit.Blocks[0] != full {
		t.Errorf("prefix hit after free: %+v", hit)
	}
}

func TestAllocateFailsCleanly(t *testing.T) {
	m := NewManager(3, 4, true)
	if !m.Allocate(1, 8, Computed{}) {
		t.Fatal("allocate 8 tokens in 3 blocks")
	}
	if m.Allocate(2, 5, Computed{}) {
		t.Fatal("allocated 2 blocks with 1 free")
	}
	if m.Has(2) || m.Pool().NumFree() != 1 {
		t.Fatalf("failed Allocate changed state: has %v free %d", m.Has(2), m.Pool().NumFree())
	}
	if !m.Allocate(1, 4, Computed{}) || m.Allocate(1, 1, Computed{}) {
		t.Fatal("filling the pool")
	}
	if m.Slots(1) != 12 {
		t.Fatalf("slots %d", m.Slots(1))
	}
	if err := m.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestPartialBlocks walks the partial-block cases of ComputedBlocks by hand
// (block size 4): a freed sequence's partly computed last block, a snapshot
// of a running short prompt, a full block covering all the prompt has left,
// and eviction.
func TestPartialBlocks(t *testing.T) {
	seq7 := []int32{1, 2, 3, 4, 5, 6, 7}
	cases := []struct {
		name    string
		setup   func(m *Manager)
		prompt  []int32
		full    int // full blocks hit
		partial int // tokens taken from a partial block
	}{
		{"freed tail continued", func(m *Manager) { run(t, m, 1, seq7, 7); m.Free(1) }, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, 1, 3},
		{"freed tail, whole prompt", func(m *Manager) { run(t, m, 1, seq7, 7); m.Free(1) }, seq7, 1, 2},
		{"freed tail, other tokens", func(m *Manager) { run(t, m, 1, seq7, 7); m.Free(1) }, []int32{1, 2, 3, 4, 5, 6, 9, 9}, 1, 0},
		{"tail of a live seq is not cached", func(m *Manager) { run(t, m, 1, seq7, 7) }, []int32{1, 2, 3, 4, 5, 6, 7, 8}, 1, 0},
		{"snapshot of a live short prompt", func(m *Manager) { run(t, m, 1, seq7[:3], 3); m.SnapshotTail(1) }, seq7[:3], 0, 2},
		{"full block, all that is left", func(m *Manager) { run(t, m, 1, seq7[:4], 4); m.Free(1) }, seq7[:4], 0, 3},
		{"caching off", nil, seq7, 0, 0},
		{"evicted", func(m *Manager) {
			run(t, m, 1, seq7, 7)
			m.Free(1)
			for i := 0; i < m.Pool().NumBlocks(); i++ {
				m.Pool().Get()
			}
		}, []int32{1, 2, 3, 4, 5, 6, 7, 8}, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManager(4, 4, tc.setup != nil)
			if tc.setup != nil {
				tc.setup(m)
			}
			hit := m.ComputedBlocks(tc.prompt)
			if len(hit.Blocks) != tc.full || hit.PartialLen != tc.partial {
				t.Fatalf("hit %d full blocks + %d tokens, want %d + %d", len(hit.Blocks), hit.PartialLen, tc.full, tc.partial)
			}
			if tc.name == "evicted" {
				return
			}
			m.TakeCopies()
			if !m.Allocate(9, len(tc.prompt)-hit.Tokens(4), hit) {
				t.Fatal("allocate")
			}
			src, dst, slots := m.TakeCopies()
			if tc.partial > 0 {
				table := m.BlockTable(9)
				if len(src) != 1 || src[0] != hit.PartialBlock || dst[0] != table[tc.full] || dst[0] == src[0] || int(slots[0]) != tc.partial {
					t.Errorf("copy %v → %v of %v slots for partial block %d of %d tokens, table %v", src, dst, slots, hit.PartialBlock, tc.partial, table)
				}
			} else if len(src) != 0 {
				t.Errorf("%d copies without a partial hit", len(src))
			}
			if err := m.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// run admits seq with tokens and marks the first computed of them computed.
func run(t *testing.T, m *Manager, seq SeqID, tokens []int32, computed int) {
	t.Helper()
	if !m.Allocate(seq, len(tokens), Computed{}) {
		t.Fatal("allocate")
	}
	m.CacheBlocks(seq, tokens, computed)
}

func TestHashPrefixes(t *testing.T) {
	toks := []int32{5, -1, 70000, 3}
	out := make([]uint64, len(toks))
	hashPrefixes(0xabc, toks, out)
	for k := 1; k <= len(toks); k++ {
		if want := HashBlock(0xabc, toks[:k]); out[k-1] != want {
			t.Errorf("prefix %d: %x, want %x", k, out[k-1], want)
		}
	}
}

// TestBlockIndex drives the pool's hash index through random registrations
// and removals against a Go map: small tables so that runs wrap around the
// end and deletions shift entries back, hashes that share home slots, and
// hashes that share the whole 32-bit tag (told apart only by the block's
// own hash).
func TestBlockIndex(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	// cInv is the inverse of the tag's multiplier mod 2^64: h + k·cInv has
	// the tag of h (for small k, barring a carry into the top half).
	const c = uint64(0x9E3779B97F4A7C15)
	cInv := c
	for range 5 {
		cInv *= 2 - c*cInv
	}
	if c*cInv != 1 {
		t.Fatalf("inverse: %x", c*cInv)
	}
	tagTwins := 0
	for _, n := range []int{1, 5, 8, 100} {
		x := newBlockIndex(n)
		blocks := make([]block, 4*n)
		ref := map[uint64]int32{}
		byID := map[int32]uint64{}
		keys := []uint64{}
		for step := range 20000 {
			if len(ref) < n && r.IntN(2) == 0 {
				var h uint64
				switch {
				case len(keys) > 0 && r.IntN(4) == 0:
					h = keys[r.IntN(len(keys))] + uint64(1+r.IntN(3))*cInv // same tag
				case len(keys) > 0 && r.IntN(3) == 0:
					h = keys[r.IntN(len(keys))] ^ uint64(r.IntN(4)) // near misses
				default:
					h = r.Uint64() >> uint(r.IntN(60)) // small and large values
				}
				if _, ok := ref[h]; ok {
					continue
				}
				id := int32(r.IntN(len(blocks)))
				for _, used := byID[id]; used; _, used = byID[id] {
					id = int32(r.IntN(len(blocks)))
				}
				if got := x.insert(blocks, h, id); got != id {
					t.Fatalf("n=%d step %d: insert(%x, %d) found %d", n, step, h, id, got)
				}
				blocks[id].hash = h
				for _, k := range keys {
					if k != h && indexTag(k) == indexTag(h) {
						tagTwins++
						break
					}
				}
				// A second registration under h keeps the first.
				if got := x.insert(blocks, h, (id+1)%int32(len(blocks))); got != id {
					t.Fatalf("n=%d step %d: duplicate insert returned %d, want %d", n, step, got, id)
				}
				ref[h], byID[id] = id, h
				keys = append(keys, h)
			} else if len(keys) > 0 {
				i := r.IntN(len(keys))
				h := keys[i]
				keys[i] = keys[len(keys)-1]
				keys = keys[:len(keys)-1]
				id := ref[h]
				x.del(h, id)
				x.del(h, id) // absent: no-op
				delete(ref, h)
				delete(byID, id)
				blocks[id].hash = r.Uint64() // stale hashes must not match
			}
			if x.n != len(ref) {
				t.Fatalf("n=%d step %d: index counts %d, want %d", n, step, x.n, len(ref))
			}
			if step%97 == 0 {
				if err := x.check(); err != nil {
					t.Fatalf("n=%d step %d: %v", n, step, err)
				}
				for h, id := range ref {
					if got, ok := x.get(blocks, h); !ok || got != id {
						t.Fatalf("n=%d step %d: get(%x) = %d,%v; want %d", n, step, h, got, ok, id)
					}
				}
				for _, h := range keys {
					miss := h + cInv
					if _, in := ref[miss]; in {
						continue
					}
					if id, ok := x.get(blocks, miss); ok {
						t.Fatalf("n=%d step %d: get(%x), a tag twin of %x, found %d", n, step, miss, h, id)
					}
				}
			}
		}
	}
	if tagTwins == 0 {
		t.Fatal("no two keys shared a tag: the verification path went untested")
	}
}

// TestCacheLimitAndTruncate: a sequence bounded by SetCacheLimit registers
// only the blocks below the bound (and no partial tail past it), its
// forks inherit the bound, and Truncate gives back the blocks past the cut
// and takes a partly kept block out of the cache.
func TestCacheLimitAndTruncate(t *testing.T) {
	m := NewManager(16, 4, true)
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if !m.Allocate(1, len(toks), Computed{}) {
		t.Fatal("allocate")
	}
	m.SetCacheLimit(1, 6)
	m.CacheBlocks(1, toks, len(toks))
	if n := m.Pool().NumCached(); n != 1 {
		t.Fatalf("%d blocks cached under a limit of 6 tokens, want 1 (tokens 0-3)", n)
	}
	m.Fork(1, 2)
	m.CacheBlocks(2, toks, len(toks))
	if n := m.Pool().NumCached(); n != 1 {
		t.Errorf("the fork registered past its parent's limit: %d cached", n)
	}
	m.Free(2)
	if n := m.Pool().NumCached(); n != 1 {
		t.Errorf("freeing the fork registered its tail past the limit: %d cached", n)
	}
	// A sequence without a limit: three blocks, two full ones cached.
	if !m.Allocate(3, len(toks), Computed{}) {
		t.Fatal("allocate")
	}
	m.CacheBlocks(3, toks, len(toks))
	cached := m.Pool().NumCached()
	free := m.Pool().NumFree()
	m.Truncate(3, 5) // keeps block 0 whole and block 1 in part
	if got := len(m.BlockTable(3)); got != 2 || m.Slots(3) != 5 {
		t.Fatalf("after Truncate(5): %d blocks, %d slots; want 2 and 5", got, m.Slots(3))
	}
	if m.Pool().NumFree() != free+1 {
		t.Errorf("Truncate freed %d blocks, want 1", m.Pool().NumFree()-free)
	}
	if m.Pool().NumCached() != cached-1 {
		t.Errorf("the partly kept block stayed in the cache: %d cached, want %d", m.Pool().NumCached(), cached-1)
	}
	// Appending from the cut writes position 5 onwards into block 1.
	if !m.Allocate(3, 3, Computed{}) || m.Slots(3) != 8 || len(m.BlockTable(3)) != 2 {
		t.Errorf("append after Truncate: %d slots in %d blocks", m.Slots(3), len(m.BlockTable(3)))
	}
	m.Free(1)
	m.Free(3)
	if err := m.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if m.Pool().NumFree() != 16 {
		t.Errorf("%d of 16 blocks free after every sequence left", m.Pool().NumFree())
	}
}

// TestComputedBlocksScratch: a prefix hit comes back in the manager's
// scratch, so looking up a cached prompt allocates nothing once the
// scratch has grown, and Allocate takes a copy: the next lookup does not
// change the admitted sequence's block table.
func TestComputedBlocksScratch(t *testing.T) {
	m := NewManager(64, 2, true)
	prompt := []int32{1, 2, 3, 4, 5, 6, 7}
	if !m.Allocate(0, len(prompt), Computed{}) {
		t.Fatal("allocate")
	}
	m.CacheBlocks(0, prompt, len(prompt))
	if allocs := testing.AllocsPerRun(10, func() { m.ComputedBlocks(prompt) }); allocs != 0 {
		t.Errorf("a cached prompt's lookup allocated %.0f times, want 0", allocs)
	}
	hit := m.ComputedBlocks(prompt)
	if len(hit.Blocks) != 3 {
		t.Fatalf("hit %d blocks, want 3", len(hit.Blocks))
	}
	if !m.Allocate(1, 1, hit) {
		t.Fatal("allocate the hit")
	}
	want := slices.Clone(m.BlockTable(1))
	m.ComputedBlocks([]int32{9, 9, 9})   // a miss
	hit2 := m.ComputedBlocks(prompt[:5]) // a shorter hit in the same scratch
	if got := m.BlockTable(1); !slices.Equal(got, want) || len(hit2.Blocks) != 2 {
		t.Errorf("block table %v after more lookups, want %v (second hit %d blocks)", got, want, len(hit2.Blocks))
	}
}

// BenchmarkAdmitCached: a 24-token prompt whose blocks are all cached
// (the prefix lookup and the admission of a couplet's follow-up) at the
// CUDA default of 2-token blocks; allocs/op is what the engine loop pays.
func BenchmarkAdmitCached(b *testing.B) {
	const bs = 2
	m := NewManager(1024, bs, true)
	prompt := make([]int32, 24)
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}
	if !m.Allocate(0, len(prompt), Computed{}) {
		b.Fatal("allocate")
	}
	m.CacheBlocks(0, prompt, len(prompt))
	b.ReportAllocs()
	for b.Loop() {
		c := m.ComputedBlocks(prompt)
		if len(c.Blocks) != len(prompt)/bs-1 {
			b.Fatalf("%d blocks hit", len(c.Blocks))
		}
		if !m.Allocate(1, 4, c) {
			b.Fatal("allocate")
		}
		m.Free(1)
	}
}
