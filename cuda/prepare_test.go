package cuda

import (
	"slices"
	"testing"

	"chunlian/forward"
	"chunlian/model"
)

// hostOnlyBackend is a Backend with only the host-side fields prepare
// reads (no device), so batch packing and validation run on any machine.
func hostOnlyBackend() *Backend {
	c := model.TestConfig()
	return &Backend{cfg: c, opt: Options{BlockSize: 4}, numBlocks: 8, maxPos: c.MaxPositions}
}

func twoSeqBatch() *forward.Batch {
	// seq 0: 3 prompt tokens at positions 0..2 in block 5;
	// seq 1: one decode token at position 5 (blocks 2, 7).
	return &forward.Batch{
		Tokens:      []int32{11, 12, 13, 14},
		Positions:   []int32{0, 1, 2, 5},
		SlotMapping: []int32{20, 21, 22, 29},
		Seqs: []forward.SeqSpan{
			{Start: 0, Len: 3, CtxLen: 3, BlockTable: []int32{5}},
			{Start: 3, Len: 1, CtxLen: 6, BlockTable: []int32{2, 7}},
		},
		LogitRows: []int{2, 3},
	}
}

func TestPreparePacksMetadata(t *testing.T) {
	b := hostOnlyBackend()
	bt := twoSeqBatch()
	off, stride, err := b.prepare(bt, make([]float32, 2*b.cfg.VocabSize))
	if err != nil {
		t.Fatal(err)
	}
	if stride != 2 {
		t.Fatalf("stride %d, want 2 (longest block table)", stride)
	}
	h := b.hostMeta
	for _, tc := range []struct {
		name string
		got  []int32
		want []int32
	}{
		{"tokens", h[off[0]:off[1]], []int32{11, 12, 13, 14}},
		{"positions", h[off[1]:off[2]], []int32{0, 1, 2, 5}},
		{"slots", h[off[2]:off[3]], []int32{20, 21, 22, 29}},
		{"tokSeq", h[off[3]:off[4]], []int32{0, 0, 0, 1}},
		{"rows", h[off[4]:off[5]], []int32{2, 3}},
		{"tables", h[off[5] : off[5]+4], []int32{5, 0, 2, 7}}, // seq 0 padded with 0
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// TestPrepareRejects lists malformed batches that must fail on the host,
// before anything reaches the device.
func TestPrepareRejects(t *testing.T) {
	b := hostOnlyBackend()
	V := b.cfg.VocabSize
	for name, mut := range map[string]func(bt *forward.Batch){
		"token≥V":          func(bt *forward.Batch) { bt.Tokens[0] = int32(V) },
		"token<0":          func(bt *forward.Batch) { bt.Tokens[1] = -1 },
		"slot≥cache":       func(bt *forward.Batch) { bt.SlotMapping[3] = 32 },
		"slot<0":           func(bt *forward.Batch) { bt.SlotMapping[0] = -1 },
		"block≥numBlocks":  func(bt *forward.Batch) { bt.Seqs[1].BlockTable[1] = 8 },
		"position≥maxPos":  func(bt *forward.Batch) { bt.Positions[0] = int32(b.maxPos) },
		"position no blk":  func(bt *forward.Batch) { bt.Positions[3] = 8 },
		"row≥T":            func(bt *forward.Batch) { bt.LogitRows[1] = 4 },
		"orphan token":     func(bt *forward.Batch) { bt.Seqs[0].Len = 2 },
		"overlapping seqs": func(bt *forward.Batch) { bt.Seqs[1].Start = 2 },
		"span past end":    func(bt *forward.Batch) { bt.Seqs[1].Len = 2 },
		"short positions":  func(bt *forward.Batch) { bt.Positions = bt.Positions[:3] },
		"empty":            func(bt *forward.Batch) { *bt = forward.Batch{} },
	} {
		bt := twoSeqBatch()
		mut(bt)
		if _, _, err := b.prepare(bt, make([]float32, 2*V)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, _, err := b.prepare(twoSeqBatch(), make([]float32, 2*V-1)); err == nil {
		t.Error("short logits buffer accepted")
	}
}
