package main

import (
	"math"
	"slices"
	"testing"

	"chunlian/forward"
	"chunlian/model"
)

// chars lists the test model's non-special tokens (its characters).
func chars(m *model.Model) []string {
	var cs []string
	for id := int32(0); id < int32(m.Config.VocabSize); id++ {
		if !m.Tok.IsSpecial(id) {
			cs = append(cs, m.Tok.Token(id))
		}
	}
	return cs
}

// The sequence is training/common.py's full_ids in lower mode, without a
// banner: specials, length token, 上联, <sep>, 下联, <eos>; unknown
// characters become <unk>; the scored part starts at the 下联.
func TestLowerSequence(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 3)
	chars := chars(m)[:3]
	id := func(s string) int32 { v, _ := m.Tok.ID(s); return v }
	len3, _ := m.LengthToken(3)
	up := chars[0] + chars[1] + chars[2]
	lo := chars[2] + "\U0001F600" + chars[0] // an emoji: not in any vocabulary
	ids, start, err := lowerSequence(m, up, lo)
	if err != nil {
		t.Fatal(err)
	}
	want := []int32{m.Special("bos"), m.Special("lower"), len3, m.Special("up"),
		id(chars[0]), id(chars[1]), id(chars[2]), m.Special("sep"),
		id(chars[2]), m.Special("unk"), id(chars[0]), m.Special("eos")}
	if !slices.Equal(ids, want) || start != 8 {
		t.Errorf("ids %v start %d, want %v start 8", ids, start, want)
	}
	if _, _, err := lowerSequence(m, "", lo); err == nil {
		t.Error("an empty 上联 (no length token) was accepted")
	}
}

// lowerNLL, which packs many sequences into each step and asks for logits
// only at the scored rows, must equal a plain computation: one sequence per
// forward pass on a backend of another block size, logits at every
// position, float64 log-softmax.
func TestLowerNLLMatchesPlain(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 3)
	vocab := chars(m)
	line := func(i, n int) string {
		s := ""
		for k := range n {
			s += vocab[(i*7+k*3)%len(vocab)]
		}
		return s
	}
	// 300 pairs of 3..9 characters: several steps and a partial last one.
	var ups, los []string
	for i := range 300 {
		n := 3 + i%7
		ups, los = append(ups, line(i, n)), append(los, line(i+1, n))
	}
	var calls []int
	nll, tokens, err := lowerNLL(m, ups, los, func(done int) { calls = append(calls, done) })
	if err != nil {
		t.Fatal(err)
	}

	be, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: 4, KVCacheBytes: 64 * forward.KVBytesPerToken(m.Config)})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	V := m.Config.VocabSize
	var want float64
	wantTokens := 0
	for i := range ups {
		ids, start, err := lowerSequence(m, ups[i], los[i])
		if err != nil {
			t.Fatal(err)
		}
		L := len(ids)
		bt := forward.Batch{Tokens: ids, Seqs: []forward.SeqSpan{{Start: 0, Len: L, CtxLen: L}}}
		for p := range L {
			bt.Positions = append(bt.Positions, int32(p))
			bt.SlotMapping = append(bt.SlotMapping, int32(p))
			bt.LogitRows = append(bt.LogitRows, p)
			if p%4 == 0 {
				bt.Seqs[0].BlockTable = append(bt.Seqs[0].BlockTable, int32(p/4))
			}
		}
		logits := make([]float32, L*V)
		if err := be.Forward(&bt, logits); err != nil {
			t.Fatal(err)
		}
		for p := start - 1; p < L-1; p++ {
			row := logits[p*V : (p+1)*V]
			var z float64
			for _, v := range row {
				z += math.Exp(float64(v))
			}
			want += math.Log(z) - float64(row[ids[p+1]])
			wantTokens++
		}
	}
	if tokens != wantTokens {
		t.Errorf("%d tokens scored, want %d", tokens, wantTokens)
	}
	if d := math.Abs(nll-want) / want; d > 1e-6 {
		t.Errorf("NLL %.6f, plain %.6f (relative difference %.2g)", nll, want, d)
	}
	if len(calls) < 2 || calls[len(calls)-1] != len(ups) || !slices.IsSorted(calls) {
		t.Errorf("progress calls %v: want several, increasing, ending at %d", calls, len(ups))
	}
}

// lowerGreedy (groups of 64, KV cache, one decode token per sequence per
// step) must pick what plain greedy decoding picks: the whole prefix
// recomputed for every token, one sequence at a time, argmax over the
// non-special ids (lowest id on ties).
func TestLowerGreedyMatchesPlain(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 5)
	vocab := chars(m)
	var ups []string
	for i := range 70 { // two groups, the second partial
		s := ""
		for k := range 3 + i%6 {
			s += vocab[(i*5+k*11)%len(vocab)]
		}
		ups = append(ups, s)
	}
	got, err := lowerGreedy(m, ups, nil)
	if err != nil {
		t.Fatal(err)
	}
	be, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: 64, KVCacheBytes: 64 * forward.KVBytesPerToken(m.Config)})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	V := m.Config.VocabSize
	logits := make([]float32, V)
	for i, u := range ups {
		ids, start, err := lowerSequence(m, u, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = ids[:start]
		want := ""
		for range len([]rune(u)) {
			L := len(ids)
			bt := forward.Batch{Tokens: ids, LogitRows: []int{L - 1},
				Seqs: []forward.SeqSpan{{Start: 0, Len: L, CtxLen: L, BlockTable: []int32{0}}}}
			for p := range L {
				bt.Positions = append(bt.Positions, int32(p))
				bt.SlotMapping = append(bt.SlotMapping, int32(p))
			}
			if err := be.Forward(&bt, logits); err != nil {
				t.Fatal(err)
			}
			best := int32(-1)
			for id, v := range logits {
				if !m.Tok.IsSpecial(int32(id)) && (best < 0 || v > logits[best]) {
					best = int32(id)
				}
			}
			want += m.Tok.Token(best)
			ids = append(slices.Clone(ids), best)
		}
		if got[i] != want {
			t.Errorf("上联 %d %q: %q, plain greedy %q", i, u, got[i], want)
		}
	}
}
