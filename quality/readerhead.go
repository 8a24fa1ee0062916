package quality

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"chunlian/forward"
	"chunlian/model"
)

// Marked is one couplet of a recorded blind reading with the readers'
// marks (h would hang, a acceptable, o odd; one per reader).
type Marked struct {
	Word, Upper, Lower string
	Marks              []string
}

// OddShare is the share of r's marks that are "o".
func (r Marked) OddShare() float64 {
	n := 0
	for _, m := range r.Marks {
		if m == "o" {
			n++
		}
	}
	return float64(n) / float64(max(1, len(r.Marks)))
}

// ReadMarked reads every couplet with marks from the readings files
// (*.tsv) of dir: each file's header lines name the columns (word, upper,
// lower, reader1, reader2; others are ignored), '#' lines are comments.
// Rows of a header without both reader columns or a word are skipped.
func ReadMarked(dir string) ([]Marked, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.tsv"))
	if err != nil {
		return nil, err
	}
	var out []Marked
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		col := map[string]int{}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			c := strings.Split(line, "\t")
			if slices.Contains(c, "upper") && slices.Contains(c, "lower") {
				clear(col)
				for i, name := range c {
					col[name] = i
				}
				continue
			}
			get := func(name string) string {
				if i, ok := col[name]; ok && i < len(c) {
					return c[i]
				}
				return ""
			}
			r := Marked{Word: get("word"), Upper: get("upper"), Lower: get("lower")}
			for _, k := range []string{"reader1", "reader2"} {
				if m := get(k); m == "h" || m == "a" || m == "o" {
					r.Marks = append(r.Marks, m)
				}
			}
			if r.Word != "" && r.Upper != "" && len(r.Marks) == 2 {
				out = append(out, r)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return out, nil
}

// ReaderFeatures returns, for each couplet of rs that m can encode, the
// mean final-normed hidden state ([d]) of the rows that produce its line
// tokens under the keyword prompt (the rows a generated couplet's log-prob
// and reader score come from: the last prompt token's, then each line
// token's but the last), and the indices into rs of the couplets kept.
// progress, if not nil, hears every 500 couplets.
func ReaderFeatures(m *model.Model, rs []Marked, progress io.Writer) (feats [][]float32, kept []int, err error) {
	cpu, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: 16, KVCacheBytes: 4 << 20, BF16MaxRows: -1})
	if err != nil {
		return nil, nil, err
	}
	defer cpu.Close()
	d, V := m.Config.HiddenSize, m.Config.VocabSize
	pt := m.PromptTokens()
	var logits []float32
	for i, r := range rs {
		if progress != nil && i%500 == 0 {
			fmt.Fprintf(progress, "reader features: %d/%d couplets\n", i, len(rs))
		}
		L := len([]rune(r.Upper))
		lt, ok := m.LengthToken(L)
		if !ok || len([]rune(r.Lower)) != L {
			continue
		}
		word, e1 := m.Tok.Encode(r.Word)
		upper, e2 := m.Tok.Encode(r.Upper)
		lower, e3 := m.Tok.Encode(r.Lower)
		if e1 != nil || e2 != nil || e3 != nil {
			continue // a character outside the vocabulary
		}
		prompt, err := pt.Prompt(model.LayoutKeyword, word, lt, upper)
		if err != nil {
			continue
		}
		toks := append(prompt, lower...)
		T, n := len(toks), 2*L+1 // n line tokens: 上联, separator, 下联
		b := &forward.Batch{Tokens: toks}
		for t := range T {
			b.Positions = append(b.Positions, int32(t))
			b.SlotMapping = append(b.SlotMapping, int32(t))
		}
		for t := T - n - 1; t < T-1; t++ {
			b.LogitRows = append(b.LogitRows, t)
		}
		var table []int32
		for blk := 0; blk*cpu.BlockSize() < T; blk++ {
			table = append(table, int32(blk))
		}
		b.Seqs = []forward.SeqSpan{{Start: 0, Len: T, CtxLen: T, BlockTable: table}}
		if need := n * V; len(logits) < need {
			logits = make([]float32, need)
		}
		if err := cpu.Forward(b, logits[:n*V]); err != nil {
			return nil, nil, fmt.Errorf("reader features of %s / %s: %w", r.Upper, r.Lower, err)
		}
		h := cpu.HiddenRows()
		mean := make([]float32, d)
		for k := range n {
			for j := range d {
				mean[j] += h[k*d+j] / float32(n)
			}
		}
		feats = append(feats, mean)
		kept = append(kept, i)
	}
	return feats, kept, nil
}

// FitReaderHead fits a reader head by ridge regression of y on feats
// (each [d]): the features standardised, lambda the penalty on the
// standardised weights, the result mapped back to raw hidden units so
// that ReaderHead.Score of a mean hidden state is the prediction.
func FitReaderHead(feats [][]float32, y []float64, lambda float64) *model.ReaderHead {
	n, d := len(feats), len(feats[0])
	mu, sd := make([]float64, d), make([]float64, d)
	for _, f := range feats {
		for j, v := range f {
			mu[j] += float64(v) / float64(n)
		}
	}
	for _, f := range feats {
		for j, v := range f {
			sd[j] += (float64(v) - mu[j]) * (float64(v) - mu[j]) / float64(n)
		}
	}
	for j := range sd {
		sd[j] = math.Sqrt(sd[j]) + 1e-9
	}
	ym := 0.0
	for _, v := range y {
		ym += v / float64(n)
	}
	// A = ZᵀZ + λI | Zᵀ(y − ȳ), solved by Gaussian elimination (A is
	// symmetric positive definite, so no pivoting is needed).
	A := make([][]float64, d)
	for i := range A {
		A[i] = make([]float64, d+1)
	}
	z := make([]float64, d)
	for r, f := range feats {
		for j, v := range f {
			z[j] = (float64(v) - mu[j]) / sd[j]
		}
		t := y[r] - ym
		for i := range d {
			row, zi := A[i], z[i]
			for j := range d {
				row[j] += zi * z[j]
			}
			row[d] += zi * t
		}
	}
	for i := range d {
		A[i][i] += lambda
	}
	for i := range d {
		for k := i + 1; k < d; k++ {
			f := A[k][i] / A[i][i]
			for j := i; j <= d; j++ {
				A[k][j] -= f * A[i][j]
			}
		}
	}
	w := make([]float64, d)
	for i := d - 1; i >= 0; i-- {
		s := A[i][d]
		for j := i + 1; j < d; j++ {
			s -= A[i][j] * w[j]
		}
		w[i] = s / A[i][i]
	}
	head := &model.ReaderHead{Weight: make([]float32, d)}
	bias := ym
	for j := range d {
		head.Weight[j] = float32(w[j] / sd[j])
		bias -= w[j] / sd[j] * mu[j]
	}
	head.Bias = float32(bias)
	return head
}

// PairAUC is the share of same-word pairs of couplets that the readers
// tell apart (different odd shares) which score orders as they do (the
// less odd one higher; ties count half); 0.5 is chance.
func PairAUC(words []string, odd, score []float64) float64 {
	ok, n := 0.0, 0.0
	for i := range words {
		for j := range words {
			if words[i] != words[j] || !(odd[i] < odd[j]) {
				continue
			}
			n++
			switch {
			case score[i] > score[j]:
				ok++
			case score[i] == score[j]:
				ok += 0.5
			}
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return ok / n
}
