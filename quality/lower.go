package quality

import (
	"fmt"

	"chunlian/forward"
	"chunlian/kvcache"
	"chunlian/model"
	"chunlian/sampler"
)

// LowerSequence is the lower-mode training sequence of docs/EVAL.md's
// perplexity (model.PromptTokens.Sequence without a banner, as
// training/common.py full_ids):
//
//	<bos> <low> <len_N> <up> {upper} <sep> {lower} <eos>
//
// with N = the 上联's length in characters. Characters outside the
// vocabulary become <unk>, as on the Python side. It returns the ids and
// the index of the first scored token (the 下联's first character; the
// 下联 and <eos> are scored).
func LowerSequence(m *model.Model, upper, lower string) ([]int32, int, error) {
	up, lo := []rune(upper), []rune(lower)
	n, ok := m.LengthToken(len(up))
	if !ok {
		return nil, 0, fmt.Errorf("上联 of %d characters: no length token", len(up))
	}
	unk := m.Special("unk")
	chars := func(ids []int32, rs []rune) []int32 {
		for _, r := range rs {
			id, ok := m.Tok.ID(string(r))
			if !ok {
				id = unk
			}
			ids = append(ids, id)
		}
		return ids
	}
	pt := m.PromptTokens()
	upIDs := chars(nil, up)
	prompt, err := pt.Prompt(model.LayoutLower, nil, n, upIDs)
	if err != nil {
		return nil, 0, err
	}
	ids, err := pt.Sequence(model.LayoutLower, nil, n, upIDs, chars(nil, lo), nil)
	return ids, len(prompt), err
}

// LowerBackend makes the forward pass LowerNLL and LowerGreedy run on: a
// fresh backend of their own (not the engine's, which belongs to the
// engine goroutine) with blockSize-token blocks and room for kvTokens
// tokens of KV cache, and MaxStep, the most tokens one step of it takes
// (0 = 2048). The zero value is the float32 CPU backend.
type LowerBackend struct {
	New     func(m *model.Model, blockSize, kvTokens int) (forward.Backend, error)
	MaxStep int
	Name    string // what reports call it, e.g. "CPU" or "CUDA, bf16 GEMMs"
}

// name is Name, "CPU" for the zero value.
func (lb LowerBackend) name() string {
	if lb.Name == "" {
		return "CPU"
	}
	return lb.Name
}

// CPULower is the CPU backend as the service runs it: float32 GEMM
// inputs, or with int8 the int8 weight copies (forward.CPUOptions.Int8),
// or with bf16Dot the bf16-rounded inputs (forward.CPUOptions.BF16Dot)
// (both: steps within the rows those paths serve,
// forward.DefaultBF16MaxRows).
func CPULower(int8, bf16Dot bool) LowerBackend {
	lb := LowerBackend{New: func(m *model.Model, bs, kvTokens int) (forward.Backend, error) {
		return forward.NewCPU(m, forward.CPUOptions{BlockSize: bs, KVCacheBytes: int64(kvTokens) * forward.KVBytesPerToken(m.Config), Int8: int8, BF16Dot: bf16Dot})
	}}
	lb.Name = "CPU"
	switch {
	case int8:
		lb.MaxStep, lb.Name = forward.DefaultBF16MaxRows, "CPU, int8 weights"
	case bf16Dot:
		lb.MaxStep, lb.Name = forward.DefaultBF16MaxRows, "CPU, bf16 GEMM inputs"
	}
	return lb
}

// step is the most tokens one step takes.
func (lb LowerBackend) step() int {
	if lb.MaxStep > 0 {
		return lb.MaxStep
	}
	return 2048
}

func (lb LowerBackend) open(m *model.Model, bs, kvTokens int) (forward.Backend, error) {
	if lb.New == nil {
		lb = CPULower(false, false)
	}
	return lb.New(m, bs, kvTokens)
}

// LowerNLL is the teacher-forced negative log-likelihood of every pair's
// 下联 + <eos> (summed, in nats) and the number of tokens scored: the
// perplexity of docs/EVAL.md is exp(nll / tokens). It runs the model's
// forward pass on a backend of its own from lb, several sequences per
// step, each sequence's prefill in one chunk with logits only where a 下联
// token or <eos> is predicted. progress, if not nil, gets the number of
// pairs done after each step.
func LowerNLL(m *model.Model, lb LowerBackend, uppers, lowers []string, progress func(int)) (nll float64, tokens int, err error) {
	const bs = 16
	budget := lb.step() // tokens per step (and KV cache)
	be, err := lb.open(m, bs, budget)
	if err != nil {
		return 0, 0, err
	}
	defer be.Close()
	V := m.Config.VocabSize
	var (
		bt      forward.Batch
		targets []int32 // the token each logits row predicts
		logits  []float32
		block   int32
	)
	flush := func() error {
		if len(bt.Tokens) == 0 {
			return nil
		}
		if n := len(bt.LogitRows) * V; cap(logits) < n {
			logits = make([]float32, n)
		} else {
			logits = logits[:n]
		}
		if err := be.Forward(&bt, logits); err != nil {
			return err
		}
		for i, t := range targets {
			row := logits[i*V : (i+1)*V]
			nll += sampler.LogSumExp(row) - float64(row[t])
		}
		tokens += len(targets)
		bt, targets, block = forward.Batch{}, targets[:0], 0
		return nil
	}
	for i := range uppers {
		ids, start, err := LowerSequence(m, uppers[i], lowers[i])
		if err != nil {
			return 0, 0, fmt.Errorf("pair %d: %w", i+1, err)
		}
		L := len(ids)
		if L > m.Config.MaxPositions || L > budget {
			return 0, 0, fmt.Errorf("pair %d: %d tokens, more than the model's %d positions", i+1, L, m.Config.MaxPositions)
		}
		nb := (L + bs - 1) / bs
		if len(bt.Tokens)+L > budget || int(block)+nb > be.NumBlocks() {
			if err := flush(); err != nil {
				return 0, 0, err
			}
			if progress != nil {
				progress(i)
			}
		}
		table := make([]int32, nb)
		for k := range table {
			table[k] = block + int32(k)
		}
		base := appendSeq(&bt, ids, 0, table, bs)
		// Row p predicts token p+1: rows start-1 .. L-2 score the 下联 and <eos>.
		for p := start - 1; p < L-1; p++ {
			bt.LogitRows = append(bt.LogitRows, base+p)
			targets = append(targets, ids[p+1])
		}
		block += int32(nb)
	}
	if err := flush(); err != nil {
		return 0, 0, err
	}
	if progress != nil {
		progress(len(uppers))
	}
	return nll, tokens, nil
}

// LowerGreedy is docs/EVAL.md's BLEU decoding: for each 上联, greedy
// decoding of exactly len(上联) tokens after `<bos> <low> <len_N> <up>
// 上联 <sep>`, every special token forbidden (so each token is a
// character), ties to the lowest id as torch.argmax. It runs on a backend
// of its own from lb, up to 64 sequences per step with their KV cache
// blocks laid out up front. progress, if not nil, gets the number of
// 上联s done after each group.
func LowerGreedy(m *model.Model, lb LowerBackend, uppers []string, progress func(int)) ([]string, error) {
	const bs, group = 16, 64
	maxLen := 0
	for _, u := range uppers {
		maxLen = max(maxLen, 4+2*len([]rune(u))+1)
	}
	if maxLen > m.Config.MaxPositions {
		return nil, fmt.Errorf("a 上联 needs %d positions, more than the model's %d", maxLen, m.Config.MaxPositions)
	}
	perSeq := (maxLen + bs - 1) / bs
	be, err := lb.open(m, bs, group*perSeq*bs)
	if err != nil {
		return nil, err
	}
	defer be.Close()
	V := m.Config.VocabSize
	special := make([]bool, V)
	for id := range V {
		special[id] = m.Tok.IsSpecial(int32(id))
	}
	argmax := func(row []float32) int32 {
		best := int32(-1)
		for id, v := range row {
			if !special[id] && (best < 0 || v > row[best]) {
				best = int32(id)
			}
		}
		return best
	}
	out := make([]string, len(uppers))
	logits := make([]float32, group*V)
	for g0 := 0; g0 < len(uppers); g0 += group {
		g := uppers[g0:min(g0+group, len(uppers))]
		tables := make([][]int32, len(g))
		ctx := make([]int, len(g))    // tokens in the cache after the last step
		need := make([]int, len(g))   // characters still to generate
		gen := make([][]rune, len(g)) // generated characters
		var bt forward.Batch
		var cur []int // the sequence of each of bt.Seqs
		for i, u := range g {
			ids, start, err := LowerSequence(m, u, "")
			if err != nil {
				return nil, fmt.Errorf("上联 %d: %w", g0+i+1, err)
			}
			ids = ids[:start] // the prompt: up to and including <sep>
			tables[i] = make([]int32, perSeq)
			for k := range tables[i] {
				tables[i][k] = int32(i*perSeq + k)
			}
			base := appendSeq(&bt, ids, 0, tables[i], bs)
			bt.LogitRows = append(bt.LogitRows, base+len(ids)-1)
			ctx[i], need[i] = len(ids), len([]rune(u))
			cur = append(cur, i)
		}
		for len(bt.Seqs) > 0 {
			if err := be.Forward(&bt, logits[:len(bt.LogitRows)*V]); err != nil {
				return nil, err
			}
			next, nextCur := forward.Batch{}, cur[:0:0]
			for r, i := range cur {
				tok := argmax(logits[r*V : (r+1)*V])
				gen[i] = append(gen[i], []rune(m.Tok.Token(tok))...)
				if need[i]--; need[i] == 0 {
					continue
				}
				next.LogitRows = append(next.LogitRows, appendSeq(&next, []int32{tok}, ctx[i], tables[i], bs))
				ctx[i]++
				nextCur = append(nextCur, i)
			}
			bt, cur = next, nextCur
		}
		for i := range g {
			out[g0+i] = string(gen[i])
		}
		if progress != nil {
			progress(g0 + len(g))
		}
	}
	return out, nil
}

// appendSeq adds one sequence's chunk to bt: the tokens ids at positions
// pos0, pos0+1, … with their slots in the sequence's block table (blocks
// of bs tokens), and its SeqSpan (the chunk is the sequence's last, so the
// context ends with it). It returns the index of the chunk's first token.
func appendSeq(bt *forward.Batch, ids []int32, pos0 int, table []int32, bs int) int {
	base := len(bt.Tokens)
	for k, id := range ids {
		bt.Tokens = append(bt.Tokens, id)
		bt.Positions = append(bt.Positions, int32(pos0+k))
		bt.SlotMapping = append(bt.SlotMapping, kvcache.SlotIn(table, bs, pos0+k))
	}
	bt.Seqs = append(bt.Seqs, forward.SeqSpan{Start: base, Len: len(ids), CtxLen: pos0 + len(ids), BlockTable: table})
	return base
}
