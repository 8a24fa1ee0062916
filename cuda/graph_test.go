package cuda

import (
	"slices"
	"testing"
)

func TestGraphBucket(t *testing.T) {
	for _, tc := range []struct{ T, want int }{
		{0, 0}, {1, 1}, {2, 2}, {3, 4}, {5, 8}, {8, 8}, {9, 16}, {16, 16}, {17, 32},
		{256, 256}, {257, 384}, {2048, 2048}, {2049, 2560}, {8192, 8192}, {8193, 0},
	} {
		if got := graphBucket(tc.T); got != tc.want {
			t.Errorf("graphBucket(%d) = %d, want %d", tc.T, got, tc.want)
		}
	}
}

// TestPadMeta checks the padded layout a decode graph reads: real entries
// first, then padding that points at the reserved block and dummy sequence.
func TestPadMeta(t *testing.T) {
	b := hostOnlyBackend() // BlockSize 4, 8 blocks: reserved block 8, dummy slot 32
	bt := twoSeqBatch()
	bt.Tokens, bt.Positions, bt.SlotMapping = []int32{13, 14}, []int32{2, 5}, []int32{22, 29}
	bt.Seqs[0].Start, bt.Seqs[0].Len, bt.Seqs[1].Start = 0, 1, 1
	bt.LogitRows = []int{1}
	off, stride, err := b.prepare(bt, make([]float32, b.cfg.VocabSize))
	if err != nil {
		t.Fatal(err)
	}
	p, po := b.padMeta(off, 2, 1, 2, stride, 4)
	for _, tc := range []struct {
		name      string
		got, want []int32
	}{
		{"tokens", p[po[0]:po[1]], []int32{13, 14, 0, 0}},
		{"positions", p[po[1]:po[2]], []int32{2, 5, 0, 0}},
		{"slots", p[po[2]:po[3]], []int32{22, 29, 32, 32}},
		{"tokSeq", p[po[3]:po[4]], []int32{0, 1, 2, 2}},
		{"rows", p[po[4]:po[5]], []int32{1, 0, 0, 0}},
		{"tables", p[po[5]:], []int32{5, 0, 2, 7, 8, 8}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}
