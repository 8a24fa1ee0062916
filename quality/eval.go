// Package quality measures the couplet model as docs/EVAL.md defines it,
// with the Go forward pass: corpus BLEU over characters (BLEU), greedy
// lower-mode decoding with the 下联's length forced (LowerGreedy) and the
// teacher-forced 下联 perplexity (LowerNLL), on held-out pairs read by
// ReadPairs. The figures equal the PyTorch side's (training/evaluate.py)
// on the shipped model; TestShippedModelMatchesEvalJSON keeps them so.
//
// LowerGreedy and LowerNLL each run on a backend of their own
// (LowerBackend; the CPU's by default), never on an engine's backend,
// which belongs to the engine goroutine.
//
// RunEval is `chunlian eval`'s constraint evaluation on a couplet
// generator: rule pass rates, keyword inclusion and latency with the
// constraints on and off, and the figures above (EvalReport.WriteMarkdown
// prints docs/EVAL.md's section "Constrained decoding (Go engine)").
//
// It also holds the reader's instruments (docs/EVAL.md, "Reading as a
// reader does"): the blind reading kit (WriteBlindSheet, ScoreSheet,
// Wilson) and the automatic signals of chunlian's couplets against human
// ones of the same words (ComputeSignals, with package critic's scores).
package quality

// eval.go: the constraint evaluation behind `chunlian eval`. It measures
// what the couplet constraints buy and cost on the Go engine: rule pass
// rates and keyword inclusion with the constraints on and off, on blessing
// words (keyword mode) and on the 上联s of the held-out test set (lower
// mode), plus the latency per couplet, greedy BLEU, docs/EVAL.md's BLEU
// and perplexity. EvalReport.WriteMarkdown prints the section
// "Constrained decoding (Go engine)" of docs/EVAL.md.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"chunlian/couplet"
	"chunlian/model"
	"chunlian/stats"
)

// BlessingWords are the built-in blessing words (two-character words
// common in 春联) of the keyword-mode evaluation.
var BlessingWords = strings.Fields(`
平安 富贵 吉祥 如意 新春 福寿 喜庆 春风 和顺 兴旺 安康 团圆 万福 丰年 迎春
纳福 吉庆 祥和 幸福 美满 健康 长寿 快乐 和谐 繁荣 昌盛 发财 进宝 顺利 瑞雪
春光 春晖 福星 鸿运 腾飞 勤劳 致富 丰收 盛世 太平 康宁 金玉 满堂 家和 兴隆
财源 团结 奋进 福禄 欢乐 喜悦 温馨 和美 美好 锦绣 辉煌 灿烂 春色 春意 大吉`)

// BLEUResamples is the bootstrap size of the BLEU intervals (the figure
// behind it: docs/DECISIONS.md, "BLEU bootstrap resamples"); the seed is 1.
const BLEUResamples = 1000

// EvalSetup is what the evaluation runs on.
type EvalSetup struct {
	// Full is the service's generator (retrieved 横批 ranked); NoRetrieval
	// is the same model and engine with the model's own 横批 only.
	Full, NoRetrieval *couplet.Generator
	// Model runs docs/EVAL.md's BLEU and perplexity on a forward pass of
	// its own from Lower (the zero value: float32 on the CPU).
	Model *model.Model
	Lower LowerBackend
}

// EvalOptions are the evaluation's parameters. Counts are ≥ 0; a count of
// 0 skips its part.
type EvalOptions struct {
	Words       []string // keyword mode: one request per word, in order
	Length      int      // keyword mode: characters per line
	Seed        uint64   // request i of a run uses Seed+i
	Temperature float64  // the sampled runs' temperature (0 = greedy), as over HTTP
	Samples     int      // constrained keyword-mode couplets kept as samples

	TestPath    string // upper<TAB>lower pairs; unreadable = lower mode skipped with a note
	Limit       int    // lower mode: the first Limit 上联s
	BLEULimit   int    // greedy lower-mode BLEU, constraints on vs off, on this many pairs
	ForcedLimit int    // docs/EVAL.md's BLEU (length forced) on this many pairs
	PPLLimit    int    // teacher-forced perplexity on this many pairs
	BLEUOut     string // write the forced-BLEU triples here ("" = no file)
	BLEUCompare string // a BLEUOut file of another model to compare with ("" = none)

	// Progress takes one line of progress at a time (nil = silent).
	Progress func(format string, args ...any)
}

// Validate checks the options' own ranges.
func (o EvalOptions) Validate() error {
	if len(o.Words) == 0 {
		return errors.New("no blessing words")
	}
	if min(o.Limit, o.BLEULimit, o.ForcedLimit, o.PPLLimit, o.Samples) < 0 {
		return errors.New("negative count")
	}
	if err := couplet.Limits.Validate(couplet.Request{Temperature: float32(o.Temperature)}); err != nil {
		return fmt.Errorf("temperature %v: %w", o.Temperature, err)
	}
	return nil
}

// RuleRow is one (set, decoding) row of the rule table.
type RuleRow struct {
	Name                       string
	Keyword                    bool // keyword mode: the keyword column is counted
	N, R1, R2, R3, R4, All, KW int
	UpperZeGiven               int // lower mode: given 上联s ending on 仄
	Latencies                  []time.Duration
	Errors                     int // requests that returned an error
}

// add counts one couplet (keyword "" in lower mode, where rule 2 is only
// the 下联's 平 ending: the 上联 is given).
func (s *RuleRow) add(c couplet.Couplet, keyword string, lowerMode bool, d time.Duration) {
	r := couplet.Check(c.Upper, c.Lower, c.Banner)
	s.N++
	s.Latencies = append(s.Latencies, d)
	rule2 := r.Rule2()
	if lowerMode {
		rule2 = r.LowerPing
		s.UpperZeGiven += b2i(r.UpperZe)
	}
	s.R1 += b2i(r.Rule1())
	s.R2 += b2i(rule2)
	s.R3 += b2i(r.Rule3())
	s.R4 += b2i(r.Rule4())
	s.All += b2i(r.Rule1() && rule2 && r.Rule3() && r.Rule4())
	if keyword != "" {
		s.KW += b2i(couplet.ContainsKeyword(c, keyword))
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// BLEURow is one greedy lower-mode BLEU run.
type BLEURow struct {
	Name        string
	N           int
	B4, B2      float64
	MeanLatency time.Duration
}

// Sample is one constrained keyword-mode couplet with the word it was
// asked for.
type Sample struct {
	Keyword string
	couplet.Couplet
}

// EvalReport is the evaluation's result.
type EvalReport struct {
	Rows       []*RuleRow // keyword mode (one per decoding), then lower mode
	BLEU       []BLEURow  // unconstrained, constrained; empty when skipped
	BLEUPairs  int        // pairs the greedy BLEU runs were asked for
	Skipped    []string   // words the model cannot take
	Samples    []Sample
	TestNote   string // why the test set was skipped ("" = it was read)
	LowerName  string // the forward pass of the BLEU and perplexity (LowerBackend.Name)
	NumBanners int    // retrieval candidates loaded

	// docs/EVAL.md's BLEU (length forced); ForcedHyps is empty when skipped.
	ForcedHyps, ForcedRefs []string
	// Comparison with EvalOptions.BLEUCompare (CompareWith "" = none).
	CompareWith                    string
	OtherB4, DiffLo, DiffHi, Share float64

	// Teacher-forced perplexity; PPLTokens is 0 when skipped.
	PPLPairs, PPLTokens int
	PPLNLL              float64
}

// evalVariant is one way of decoding.
type evalVariant struct {
	name string
	g    *couplet.Generator
	raw  bool // constraints off
}

// evaluation is one run's state.
type evaluation struct {
	ctx      context.Context
	o        EvalOptions
	s        EvalSetup
	variants [3]evalVariant // unconstrained, model 横批 only, 横批 ranking
	r        *EvalReport
}

// RunEval runs the evaluation. Requests run one at a time, so latency is
// the single-request latency of the machine.
func RunEval(ctx context.Context, s EvalSetup, o EvalOptions) (*EvalReport, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	e := &evaluation{ctx: ctx, o: o, s: s, r: &EvalReport{NumBanners: s.Full.NumBanners(), LowerName: s.Lower.name()}}
	e.variants = [3]evalVariant{
		{"unconstrained", s.Full, true},
		{"constrained, model 横批 only", s.NoRetrieval, false},
		{"constrained + 横批 ranking", s.Full, false},
	}
	for vi := range e.variants {
		e.keywordRow(vi)
	}
	uppers, lowers, err := ReadPairs(o.TestPath, max(o.Limit, o.BLEULimit, o.PPLLimit, o.ForcedLimit))
	if err != nil {
		e.r.TestNote = fmt.Sprintf("test set skipped: %v", err)
		e.progress("%s", e.r.TestNote)
		return e.r, nil
	}
	first := func(n int) (ups, los []string) { // the first n pairs read (fewer if the file has fewer)
		n = min(n, len(uppers))
		return uppers[:n], lowers[:n]
	}
	limitU, _ := first(o.Limit)
	for _, vi := range []int{0, 2} {
		e.lowerRow(e.variants[vi], limitU)
	}
	if bu, bl := first(o.BLEULimit); len(bu) > 0 {
		e.r.BLEUPairs = len(bu)
		for _, vi := range []int{0, 1} {
			e.greedyBLEU(e.variants[vi], bu, bl)
		}
	}
	if fu, fl := first(o.ForcedLimit); len(fu) > 0 {
		if err := e.forcedBLEU(fu, fl); err != nil {
			return nil, err
		}
	}
	if pu, pl := first(o.PPLLimit); len(pu) > 0 {
		if err := e.perplexity(pu, pl); err != nil {
			return nil, err
		}
	}
	return e.r, nil
}

func (e *evaluation) progress(format string, args ...any) {
	if e.o.Progress != nil {
		e.o.Progress(format, args...)
	}
}

// generate runs one request; ok is false when the model cannot take it
// (unknown characters, too long), err when the generator failed.
func (e *evaluation) generate(g *couplet.Generator, req couplet.Request) (c couplet.Couplet, d time.Duration, ok bool, err error) {
	if g.Validate(req) != nil {
		return c, 0, false, nil
	}
	t0 := time.Now()
	cs, err := g.Generate(e.ctx, req)
	d = time.Since(t0)
	if err == nil && len(cs) == 0 {
		err = errors.New("no couplet")
	}
	if err != nil {
		return c, d, true, err
	}
	return cs[0], d, true, nil
}

// keywordRow runs keyword mode on every word with variant vi. A word the
// model cannot take is skipped (and listed once); the samples come from
// the last variant, each with its own word.
func (e *evaluation) keywordRow(vi int) {
	v := e.variants[vi]
	s := &RuleRow{Name: fmt.Sprintf("keyword (%d words) · %s", len(e.o.Words), v.name), Keyword: true}
	pr := newEvalProgress(e, s.Name, len(e.o.Words))
	for i, w := range e.o.Words {
		pr.tick(i)
		req := couplet.Request{Mode: couplet.ModeKeyword, Text: w, Length: e.o.Length, N: 1, Seed: e.o.Seed + uint64(i), Unconstrained: v.raw}
		req.SetTemperature(e.o.Temperature) // 0 = greedy
		c, d, ok, err := e.generate(v.g, req)
		switch {
		case !ok:
			if vi == 0 {
				e.r.Skipped = append(e.r.Skipped, w)
			}
			continue
		case err != nil:
			s.Errors++
			continue
		}
		s.add(c, w, false, d)
		if vi == len(e.variants)-1 && len(e.r.Samples) < e.o.Samples {
			e.r.Samples = append(e.r.Samples, Sample{Keyword: w, Couplet: c})
		}
	}
	pr.done()
	e.r.Rows = append(e.r.Rows, s)
}

// lowerRow runs lower mode on the given 上联s with v.
func (e *evaluation) lowerRow(v evalVariant, uppers []string) {
	s := &RuleRow{Name: fmt.Sprintf("lower (test.tsv, %d 上联) · %s", len(uppers), v.name)}
	pr := newEvalProgress(e, s.Name, len(uppers))
	for i, u := range uppers {
		pr.tick(i)
		req := couplet.Request{Mode: couplet.ModeLower, Text: u, N: 1, Seed: e.o.Seed + uint64(i), Unconstrained: v.raw}
		req.SetTemperature(e.o.Temperature) // 0 = greedy
		c, d, ok, err := e.generate(v.g, req)
		switch {
		case !ok:
			continue // unknown characters or too long for the model
		case err != nil:
			s.Errors++
			continue
		}
		s.add(c, "", true, d)
	}
	pr.done()
	e.r.Rows = append(e.r.Rows, s)
}

// greedyBLEU runs greedy lower mode (top-k 1) with v on the pairs. Pairs
// the model cannot take are skipped; a failed request counts as an empty
// hypothesis.
func (e *evaluation) greedyBLEU(v evalVariant, uppers, lowers []string) {
	var hyps, refs []string
	var lat []time.Duration
	name := "unconstrained"
	if !v.raw {
		name = "constrained"
	}
	pr := newEvalProgress(e, "greedy BLEU · "+name, len(uppers))
	for i, u := range uppers {
		pr.tick(i)
		req := couplet.Request{Mode: couplet.ModeLower, Text: u, N: 1, TopK: 1, Seed: e.o.Seed + uint64(i), Temperature: float32(e.o.Temperature), Unconstrained: v.raw}
		c, d, ok, _ := e.generate(v.g, req)
		if !ok {
			continue
		}
		lat = append(lat, d)
		hyps = append(hyps, c.Lower)
		refs = append(refs, lowers[i])
	}
	pr.done()
	e.r.BLEU = append(e.r.BLEU, BLEURow{name, len(hyps), BLEU(hyps, refs, 4), BLEU(hyps, refs, 2), meanDuration(lat)})
}

// forcedBLEU computes docs/EVAL.md's BLEU, writes the triples to BLEUOut
// and compares with BLEUCompare when they are set.
func (e *evaluation) forcedBLEU(uppers, lowers []string) error {
	pr := newEvalProgress(e, "greedy BLEU, length forced", len(uppers))
	hyps, err := LowerGreedy(e.s.Model, e.s.Lower, uppers, pr.tick)
	if err != nil {
		return fmt.Errorf("forced-length BLEU: %w", err)
	}
	pr.done()
	e.r.ForcedHyps, e.r.ForcedRefs = hyps, lowers
	if e.o.BLEUOut != "" {
		if err := writeTriples(e.o.BLEUOut, uppers, lowers, hyps); err != nil {
			return err
		}
	}
	if e.o.BLEUCompare != "" {
		other, err := readHyps(e.o.BLEUCompare, uppers, lowers)
		if err != nil {
			return err
		}
		e.r.CompareWith = e.o.BLEUCompare
		e.r.OtherB4 = BLEU(other, lowers, 4)
		e.r.DiffLo, e.r.DiffHi, e.r.Share = BLEUDiff(other, hyps, lowers, 4, BLEUResamples, 0.95, 1)
	}
	return nil
}

// perplexity computes the teacher-forced 下联 perplexity, the Go forward
// pass's own check of the Python side's figure.
func (e *evaluation) perplexity(uppers, lowers []string) error {
	pr := newEvalProgress(e, "teacher-forced perplexity", len(uppers))
	t0 := time.Now()
	nll, tokens, err := LowerNLL(e.s.Model, e.s.Lower, uppers, lowers, pr.tick)
	if err != nil {
		return fmt.Errorf("perplexity: %w", err)
	}
	pr.done()
	e.progress("perplexity over %d tokens in %.1fs", tokens, time.Since(t0).Seconds())
	e.r.PPLPairs, e.r.PPLTokens, e.r.PPLNLL = len(uppers), tokens, nll
	return nil
}

// writeTriples writes upper<TAB>ref<TAB>hyp lines (the BLEUOut file).
func writeTriples(path string, uppers, refs, hyps []string) error {
	var b strings.Builder
	for i := range hyps {
		fmt.Fprintf(&b, "%s\t%s\t%s\n", uppers[i], refs[i], hyps[i])
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// readHyps reads a BLEUOut file written for the same pairs (same 上联 and
// reference, same order) and returns its hypotheses.
func readHyps(path string, uppers, refs []string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != len(uppers) {
		return nil, fmt.Errorf("%s: %d lines for %d pairs", path, len(lines), len(uppers))
	}
	hyps := make([]string, len(lines))
	for i, l := range lines {
		f := strings.Split(l, "\t")
		if len(f) != 3 || f[0] != uppers[i] || f[1] != refs[i] {
			return nil, fmt.Errorf("%s: line %d is not 上联<TAB>reference<TAB>下联 for pair %q/%q", path, i+1, uppers[i], refs[i])
		}
		hyps[i] = f[2]
	}
	return hyps, nil
}

// quantile is the nearest-rank q-quantile (0 < q ≤ 1) of d
// (stats.Percentile).
func quantile(d []time.Duration, q float64) time.Duration {
	s := make([]float64, len(d))
	for i, x := range d {
		s[i] = float64(x)
	}
	slices.Sort(s)
	return time.Duration(stats.Percentile(s, 100*q))
}

func meanDuration(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var t time.Duration
	for _, x := range d {
		t += x
	}
	return t / time.Duration(len(d))
}

// evalProgress reports "label: i/n" at most every 2 seconds, so a long
// evaluation (thousands of requests, one at a time) shows it is moving.
type evalProgress struct {
	e           *evaluation
	label       string
	n           int
	start, last time.Time
}

func newEvalProgress(e *evaluation, label string, n int) *evalProgress {
	now := time.Now()
	return &evalProgress{e: e, label: label, n: n, start: now, last: now}
}

// tick is called before item i (0-based) starts.
func (p *evalProgress) tick(i int) {
	if time.Since(p.last) >= 2*time.Second {
		p.last = time.Now()
		p.e.progress("%s: %d/%d (%.0fs)", p.label, i, p.n, time.Since(p.start).Seconds())
	}
}

func (p *evalProgress) done() {
	p.e.progress("%s: %d/%d done in %.1fs", p.label, p.n, p.n, time.Since(p.start).Seconds())
}

// WriteMarkdown writes the report as docs/EVAL.md's section "Constrained
// decoding (Go engine)"; intro is its first paragraph (the model, the
// engine and the command that reproduces it).
func (r *EvalReport) WriteMarkdown(w io.Writer, intro string) {
	fmt.Fprint(w, "## Constrained decoding (Go engine)\n\n", intro, "\n\n")
	r.writeRules(w)
	r.writeBLEU(w)
	r.writeForced(w)
	if r.PPLTokens > 0 {
		nll := r.PPLNLL / float64(r.PPLTokens)
		fmt.Fprintf(w, "Teacher-forced 下联 perplexity (docs/EVAL.md's definition: the 下联 characters + `<eos>` of `<bos> <low> <len_N> <up> 上联 <sep> 下联 <eos>`, unknown characters as `<unk>`) on the first %d test.tsv pairs, computed by the Go forward pass (%s): **%.3f** (NLL %.4f nats per token over %d tokens).\n\n",
			r.PPLPairs, r.LowerName, math.Exp(nll), nll, r.PPLTokens)
	}
	r.writeNotes(w)
}

// writeRules writes the rule table and the cost of the constraints.
func (r *EvalReport) writeRules(w io.Writer) {
	fmt.Fprintln(w, "| set · decoding | couplets | rule 1 form | rule 2 仄起平收 | rule 3 same-char/mirror | rule 4 横批 | all rules | keyword present | failed | latency mean / p50 / p90 (ms) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, s := range r.Rows {
		kw := "–"
		if s.Keyword {
			kw = share(s.KW, s.N)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %d | %s / %s / %s |\n", s.Name, s.N,
			share(s.R1, s.N), share(s.R2, s.N), share(s.R3, s.N), share(s.R4, s.N), share(s.All, s.N), kw, s.Errors,
			ms(meanDuration(s.Latencies)), ms(quantile(s.Latencies, 0.5)), ms(quantile(s.Latencies, 0.9)))
	}
	fmt.Fprintln(w)
	if len(r.Rows) >= 3 && r.Rows[0].N > 0 {
		fmt.Fprintf(w, "Cost of the constraints (keyword mode, mean latency per couplet): %s ms unconstrained → %s ms constrained (model 横批 only) → %s ms with 横批 retrieval + ranking (%d retrieval candidates loaded).\n\n",
			ms(meanDuration(r.Rows[0].Latencies)), ms(meanDuration(r.Rows[1].Latencies)), ms(meanDuration(r.Rows[2].Latencies)), r.NumBanners)
	}
}

// writeBLEU writes the greedy lower-mode BLEU table.
func (r *EvalReport) writeBLEU(w io.Writer) {
	if len(r.BLEU) == 0 {
		return
	}
	fmt.Fprintf(w, "Greedy 下联 (top-k 1) in lower mode on the first %d test.tsv pairs (pairs with characters unknown to the model skipped), corpus BLEU over characters, uniform weights, no smoothing, brevity penalty. Unconstrained output is the text up to the first special token, so it may be shorter or longer than the 上联.\n\n", r.BLEUPairs)
	fmt.Fprintln(w, "| greedy lower mode | pairs | BLEU-4 | BLEU-2 | mean latency (ms) |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, b := range r.BLEU {
		fmt.Fprintf(w, "| %s | %d | %.4f | %.4f | %s |\n", b.Name, b.N, b.B4, b.B2, ms(b.MeanLatency))
	}
	fmt.Fprintln(w)
}

// writeForced writes docs/EVAL.md's BLEU and the comparison.
func (r *EvalReport) writeForced(w io.Writer) {
	if len(r.ForcedHyps) == 0 {
		return
	}
	hyps, refs := r.ForcedHyps, r.ForcedRefs
	b4 := BLEU(hyps, refs, 4)
	lo, hi := BLEUInterval(hyps, refs, 4, BLEUResamples, 0.95, 1)
	fmt.Fprintf(w, "BLEU as docs/EVAL.md defines it (greedy 下联 of exactly the 上联's length, special tokens forbidden, corpus BLEU over characters) on the first %d test.tsv pairs, computed by the Go forward pass (%s): BLEU-4 **%.6f** (95 %% bootstrap interval over the pairs, %d resamples: %.4f–%.4f), BLEU-2 %.6f.\n\n",
		len(hyps), r.LowerName, b4, BLEUResamples, lo, hi, BLEU(hyps, refs, 2))
	if r.CompareWith != "" {
		fmt.Fprintf(w, "Against `%s` on the same pairs: BLEU-4 %+.6f (this model %.6f, that one %.6f); paired bootstrap, %d resamples: 95 %% interval %+.4f to %+.4f, this model higher in %.1f %% of resamples.\n\n",
			r.CompareWith, b4-r.OtherB4, b4, r.OtherB4, BLEUResamples, r.DiffLo, r.DiffHi, 100*r.Share)
	}
}

// writeNotes writes the rule definitions, the notes and the samples.
func (r *EvalReport) writeNotes(w io.Writer) {
	fmt.Fprintln(w, "Rule definitions (`couplet.Check`): rule 1 = same length, punctuation at the same positions, only Chinese characters elsewhere; rule 2 = 上联 ends on 仄 and 下联 on 平 (modern tones, primary reading via go-pinyin) — in lower mode only the 下联's 平 ending is counted, since the 上联 is given; rule 3 = no identical character at the same position and mirrored repetition; rule 4 = 横批 of exactly four Chinese characters. \"failed\" counts requests that returned an error (constrained: every attempt dead-ended).")
	for _, s := range r.Rows {
		if !s.Keyword && s.N > 0 {
			fmt.Fprintf(w, "\nIn the lower-mode rows, %s of the given test 上联s themselves end on 仄.\n", share(s.UpperZeGiven, s.N))
			break
		}
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintf(w, "\nWords skipped (characters unknown to the model): %s.\n", strings.Join(r.Skipped, " "))
	}
	if r.TestNote != "" {
		fmt.Fprintf(w, "\n%s\n", r.TestNote)
	}
	if len(r.Samples) > 0 {
		fmt.Fprint(w, "\nSample constrained couplets (keyword mode):\n\n")
		fmt.Fprintln(w, "| keyword | 上联 | 下联 | 横批 |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for _, s := range r.Samples {
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", s.Keyword, s.Upper, s.Lower, s.Banner)
		}
	}
}

// share is a/n as a percentage ("–" when n is 0).
func share(a, n int) string {
	if n == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(n))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }
