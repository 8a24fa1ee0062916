package forward

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"testing"

	"chunlian/model"
)

// referenceFixture is forward/testdata/reference.json, written by the
// training script from PyTorch (float32 on CPU, TF32 off) for the embedded
// default model.
type referenceFixture struct {
	Model string `json:"model"`
	Cases []struct {
		Tokens []int32     `json:"tokens"`
		Rows   []int       `json:"rows"`   // positions whose full logits are given
		Logits [][]float32 `json:"logits"` // [len(Rows)][vocab]
		Argmax []int32     `json:"argmax"` // per position
	} `json:"cases"`
}

// TestPyTorchReference checks the paged forward on the default model
// against PyTorch: max |Δlogit| ≤ 1e-3 on the fixture's rows, and at every
// position PyTorch's argmax is (within 1e-3) our top logit. Each case runs
// twice: as one prefill, and as a prefill of the first half followed by
// single-token decode steps through a shuffled block table.
func TestPyTorchReference(t *testing.T) {
	raw, err := os.ReadFile("testdata/reference.json")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("forward/testdata/reference.json not present yet (written by the training helper)")
	}
	if err != nil {
		t.Fatal(err)
	}
	var fx referenceFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatalf("reference.json: %v", err)
	}
	m, err := model.Default()
	if errors.Is(err, model.ErrNoDefault) {
		t.Skip("default model not embedded yet (weights/weights.go missing)")
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(fx.Cases) == 0 {
		t.Fatal("reference.json has no cases")
	}
	V := m.Config.VocabSize
	for ci, cs := range fx.Cases {
		T := len(cs.Tokens)
		if len(cs.Argmax) != T || len(cs.Rows) != len(cs.Logits) {
			t.Fatalf("case %d: malformed (%d tokens, %d argmax, %d rows, %d logit rows)", ci, T, len(cs.Argmax), len(cs.Rows), len(cs.Logits))
		}
		for _, split := range []int{T, (T + 1) / 2} {
			got := runSplit(t, m, cs.Tokens, split) // [T][V]
			worst := 0.0
			for i, pos := range cs.Rows {
				if len(cs.Logits[i]) != V {
					t.Fatalf("case %d row %d: %d logits, vocab %d", ci, i, len(cs.Logits[i]), V)
				}
				d := maxAbsDiff(got[pos], cs.Logits[i])
				worst = math.Max(worst, d)
				if d > 1e-3 {
					t.Errorf("case %d (prefill %d) position %d: max |Δlogit| = %g > 1e-3", ci, split, pos, d)
				}
			}
			for pos, want := range cs.Argmax {
				row := got[pos]
				top := row[0]
				for _, v := range row {
					top = max(top, v)
				}
				if want < 0 || int(want) >= V || row[want] < top-1e-3 {
					t.Errorf("case %d (prefill %d) position %d: PyTorch argmax %d, ours scores it %g below our top", ci, split, pos, want, top-row[want])
				}
			}
			t.Logf("case %d, prefill %d of %d then decode: max |Δlogit| = %.3g", ci, split, T, worst)
		}
	}
}

// runSplit computes the logits of every position of tokens: the first
// split tokens in one prefill step, the rest one decode step each, with a
// reversed (non-contiguous) block table.
func runSplit(t *testing.T, m *model.Model, tokens []int32, split int) [][]float32 {
	t.Helper()
	return runSplitOpts(t, m, tokens, split, CPUOptions{})
}

// runSplitOpts is runSplit with backend options (its block size and KV
// cache size are set here).
func runSplitOpts(t *testing.T, m *model.Model, tokens []int32, split int, o CPUOptions) [][]float32 {
	t.Helper()
	const bs = 16
	T, V := len(tokens), m.Config.VocabSize
	nb := (T+bs-1)/bs + 1
	o.BlockSize, o.KVCacheBytes = bs, int64(nb*bs)*KVBytesPerToken(m.Config)
	c, err := NewCPU(m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := &seqState{tokens: tokens}
	fl := &freeList{}
	for i := 0; i < nb; i++ {
		fl.free = append(fl.free, int32(i)) // take() pops from the end: reversed order
	}
	out := make([][]float32, T)
	for s.done < T {
		n := 1
		if s.done == 0 {
			n = split
		}
		var b Batch
		addStep(&b, s, n, bs, fl)
		for j := 0; j < n; j++ {
			b.LogitRows = append(b.LogitRows, j)
		}
		logits := make([]float32, n*V)
		if err := c.Forward(&b, logits); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < n; j++ {
			out[s.done-n+j] = logits[j*V : (j+1)*V]
		}
	}
	return out
}

// TestRunSplitMatchesDense checks the fixture test's own driver on the
// random model, so a skip of TestPyTorchReference does not hide a broken
// harness.
func TestRunSplitMatchesDense(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 21)
	toks := randomTokens(newRNG(21), 37, m.Config.VocabSize)
	ref := refForward(m, toks)
	for _, split := range []int{37, 19, 1} {
		got := runSplit(t, m, toks, split)
		for pos := range toks {
			if d := maxAbsDiff(got[pos], ref[pos]); d > 1e-4 {
				t.Fatalf("split %d position %d: max |Δ| = %g", split, pos, d)
			}
		}
	}
}
