package main

// eval.go: `chunlian eval` measures what the couplet constraints buy and
// cost on the Go engine: rule pass rates and keyword inclusion with the
// constraints on and off, on a built-in list of blessing words (keyword
// mode) and on the 上联s of the held-out test set (lower mode), plus the
// latency per couplet. It prints the Markdown section "Constrained decoding
// (Go engine)" of docs/EVAL.md.

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

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"chunlian/couplet"
	"chunlian/quality"
	"chunlian/stats"
)

// newEvalCmd builds `chunlian eval`; the report goes to stdout.
func newEvalCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "eval [flags]",
		Short: "rule pass rates and latency of couplet generation, constraints on vs off (Markdown)",
		Long: `Measure what the couplet constraints buy and cost on the Go engine: rule pass
rates and keyword inclusion with the constraints on and off, on built-in
blessing words (keyword mode) and on the 上联s of the held-out test set
(lower mode), plus latency per couplet, greedy BLEU and perplexity. Prints
the Markdown section "Constrained decoding (Go engine)" of docs/EVAL.md.`,
		Example: "  chunlian eval --limit 100 --bleu-limit 100\n  chunlian eval --bleu-forced 3830 --ppl-limit 3830",
		Args:    noArgs,
	}
	run := defineEval(cmd.Flags(), stdout)
	cmd.RunE = func(*cobra.Command, []string) error { return run() }
	return withEnv(cmd)
}

// runEval parses args as `chunlian eval` would and runs it.
func runEval(args []string, stdout io.Writer) error {
	return execute(newEvalCmd(stdout), args)
}

// evalWords are the built-in blessing words (two-character words common in
// 春联) of the keyword-mode evaluation.
var evalWords = strings.Fields(`
平安 富贵 吉祥 如意 新春 福寿 喜庆 春风 和顺 兴旺 安康 团圆 万福 丰年 迎春
纳福 吉庆 祥和 幸福 美满 健康 长寿 快乐 和谐 繁荣 昌盛 发财 进宝 顺利 瑞雪
春光 春晖 福星 鸿运 腾飞 勤劳 致富 丰收 盛世 太平 康宁 金玉 满堂 家和 兴隆
财源 团结 奋进 福禄 欢乐 喜悦 温馨 和美 美好 锦绣 辉煌 灿烂 春色 春意 大吉`)

// evalStats accumulates one (set, decoding) row.
type evalStats struct {
	name                       string
	n, r1, r2, r3, r4, all, kw int
	upperZeGiven               int // lower mode: how many given 上联s end on 仄
	lat                        []time.Duration
	errs                       int
}

func (s *evalStats) add(c couplet.Couplet, keyword string, lowerMode bool, d time.Duration) {
	r := couplet.Check(c.Upper, c.Lower, c.Banner)
	s.n++
	s.lat = append(s.lat, d)
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	rule2 := r.Rule2()
	if lowerMode { // the 上联 is given: only the 下联's 平 ending is ours
		rule2 = r.LowerPing
		s.upperZeGiven += b2i(r.UpperZe)
	}
	s.r1 += b2i(r.Rule1())
	s.r2 += b2i(rule2)
	s.r3 += b2i(r.Rule3())
	s.r4 += b2i(r.Rule4())
	s.all += b2i(r.Rule1() && rule2 && r.Rule3() && r.Rule4())
	if keyword != "" {
		s.kw += b2i(couplet.KeywordPresent(c, keyword))
	}
}

func pct(a, n int) string {
	if n == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(n))
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

func mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var t time.Duration
	for _, x := range d {
		t += x
	}
	return t / time.Duration(len(d))
}

// bleuResamples is the bootstrap size of the BLEU interval: with 1,000
// resamples the interval's ends moved by at most 0.0009 over five seeds
// (run-15 weights, all 3,830 test pairs: 0.0390–0.0394 to 0.0499–0.0508),
// a sixth of its half-width; the eval uses seed 1.
const bleuResamples = 1000

// writeTriples writes upper<TAB>ref<TAB>hyp lines (the --bleu-out file).
func writeTriples(path string, uppers, refs, hyps []string) error {
	var b strings.Builder
	for i := range hyps {
		fmt.Fprintf(&b, "%s\t%s\t%s\n", uppers[i], refs[i], hyps[i])
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// readHyps reads a --bleu-out file written for the same pairs (same
// 上联 and reference, same order) and returns its hypotheses.
func readHyps(path string, uppers, refs []string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != len(uppers) {
		return nil, fmt.Errorf("--bleu-compare %s: %d lines for %d pairs", path, len(lines), len(uppers))
	}
	hyps := make([]string, len(lines))
	for i, l := range lines {
		f := strings.Split(l, "\t")
		if len(f) != 3 || f[0] != uppers[i] || f[1] != refs[i] {
			return nil, fmt.Errorf("--bleu-compare %s: line %d is not 上联<TAB>reference<TAB>下联 for pair %q/%q", path, i+1, uppers[i], refs[i])
		}
		hyps[i] = f[2]
	}
	return hyps, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

// defineEval registers eval's flags on fs and returns the run.
func defineEval(fs *pflag.FlagSet, stdout io.Writer) func() error {
	testPath := fs.String("test", "../shared/data/couplets/test.tsv", "held-out upper<TAB>lower file for the lower-mode evaluation (skipped if absent)")
	limit := fs.Int("limit", 300, "at most this many test.tsv 上联s (in file order)")
	words := fs.Int("words", len(evalWords), fmt.Sprintf("use the first N of the %d built-in blessing words", len(evalWords)))
	length := fs.Int("length", couplet.DefaultLength, "line length in keyword mode")
	seed := fs.Uint64("seed", 1, "base seed (request i uses seed+i)")
	temperature := fs.Float64("temperature", couplet.DefaultTemperature, fmt.Sprintf("sampling temperature of the sampled keyword and lower-mode runs, 0..%g as in the HTTP API (0 = greedy; the BLEU runs are greedy)", couplet.Limits.MaxTemperature))
	samples := fs.Int("samples", 8, "sample couplets to print")
	bleuLimit := fs.Int("bleu-limit", 300, "greedy lower-mode BLEU on this many test.tsv pairs, constraints on vs off (0 = skip)")
	forcedLimit := fs.Int("bleu-forced", 0, "BLEU as docs/EVAL.md defines it (greedy, exactly as many characters as the 上联, special tokens forbidden) on this many test.tsv pairs, on a CPU forward pass of its own (0 = skip; 3830 = the whole test set)")
	bleuOut := fs.String("bleu-out", "", "write the --bleu-forced pairs to this file as 上联<TAB>reference 下联<TAB>greedy 下联, one per line")
	bleuCompare := fs.String("bleu-compare", "", "a --bleu-out file of another model on the same pairs: report this model's BLEU-4 minus that one's, with a paired bootstrap interval")
	pplLimit := fs.Int("ppl-limit", 0, "teacher-forced 下联 perplexity (docs/EVAL.md's definition) on this many test.tsv pairs, on a CPU forward pass of its own (0 = skip; 3830 = the whole test set, as the Python side)")
	randomModel := fs.Bool("random-model", false, "use the tiny random test model (smoke test)")
	reader := defineReader(fs) // blind.go: --blind, --score, --signals
	var sc stackConfig
	sc.registerModel(fs)
	return func() error {
		if reader.active() {
			return runReader(sc, reader, *length, *seed, *randomModel, stdout)
		}
		return evalRun(sc, evalFlags{testPath, limit, words, length, seed, temperature, samples, bleuLimit, forcedLimit, bleuOut, bleuCompare, pplLimit, randomModel}, stdout)
	}
}

// evalFlags are eval's parsed flags.
type evalFlags struct {
	testPath                        *string
	limit, words, length            *int
	seed                            *uint64
	temperature                     *float64
	samples, bleuLimit, forcedLimit *int
	bleuOut, bleuCompare            *string
	pplLimit                        *int
	randomModel                     *bool
}

func evalRun(sc stackConfig, f evalFlags, stdout io.Writer) error {
	testPath, limit, words, length, seed, temperature := f.testPath, f.limit, f.words, f.length, f.seed, f.temperature
	samples, bleuLimit, forcedLimit, bleuOut, bleuCompare, pplLimit, randomModel := f.samples, f.bleuLimit, f.forcedLimit, f.bleuOut, f.bleuCompare, f.pplLimit, f.randomModel
	if *words < 1 || *words > len(evalWords) || *limit < 0 || *pplLimit < 0 || *forcedLimit < 0 {
		return errors.New("--words must be 1..len(built-in list), and --limit, --bleu-forced and --ppl-limit ≥ 0")
	}
	if err := couplet.Limits.Validate(couplet.Request{Temperature: float32(*temperature)}); err != nil {
		return fmt.Errorf("--temperature %v: %w", *temperature, err)
	}
	st, err := openStack(sc, *randomModel)
	if err != nil {
		return err
	}
	defer st.Close()
	full, err := couplet.New(st.Model, st.Engine, sc.generatorOptions()...)
	if err != nil {
		return err
	}
	noRetr, err := couplet.New(st.Model, st.Engine, append(sc.generatorOptions(), couplet.WithBannerSources(), couplet.WithBannerTopK(0))...)
	if err != nil {
		return err
	}
	ctx := context.Background()
	type variant struct {
		name string
		g    *couplet.Generator
		raw  bool
	}
	variants := []variant{
		{"unconstrained", full, true},
		{"constrained, model 横批 only", noRetr, false},
		{"constrained + 横批 ranking", full, false},
	}
	var rows []*evalStats
	var examples []couplet.Couplet
	var skipped []string

	// Keyword mode on the built-in words. Requests run one at a time, so
	// latency is the single-request latency on this machine.
	for vi, v := range variants {
		s := &evalStats{name: "keyword (" + fmt.Sprint(*words) + " words) · " + v.name}
		pr := newEvalProgress(s.name, *words)
		for i, w := range evalWords[:*words] {
			pr.tick(i)
			req := couplet.Request{Mode: couplet.ModeKeyword, Text: w, Length: *length, N: 1, Seed: *seed + uint64(i), Unconstrained: v.raw}
			req.SetTemperature(*temperature) // 0 = greedy
			if err := v.g.Validate(req); err != nil {
				if vi == 0 {
					skipped = append(skipped, w)
				}
				continue
			}
			t0 := time.Now()
			cs, err := v.g.Generate(ctx, req)
			d := time.Since(t0)
			if err != nil || len(cs) == 0 {
				s.errs++
				continue
			}
			s.add(cs[0], w, false, d)
			if vi == 2 && len(examples) < *samples {
				examples = append(examples, cs[0])
			}
		}
		pr.done()
		rows = append(rows, s)
	}

	// Lower mode on test.tsv 上联s.
	uppers, lowers, terr := quality.ReadPairs(*testPath, max(*limit, *bleuLimit, *pplLimit, *forcedLimit))
	first := func(n int) (ups, los []string) { // the first n pairs read (fewer if the file has fewer)
		n = min(n, len(uppers))
		return uppers[:n], lowers[:n]
	}
	bleuU, bleuL := first(*bleuLimit)
	pplU, pplL := first(*pplLimit)
	forcedU, forcedL := first(*forcedLimit)
	uppers, _ = first(*limit)
	testNote := ""
	if terr != nil {
		testNote = fmt.Sprintf("test set skipped: %v", terr)
		fmt.Fprintln(os.Stderr, "chunlian eval:", testNote)
	} else {
		for _, v := range []variant{variants[0], variants[2]} {
			s := &evalStats{name: fmt.Sprintf("lower (test.tsv, %d 上联) · %s", len(uppers), v.name)}
			pr := newEvalProgress(s.name, len(uppers))
			for i, u := range uppers {
				pr.tick(i)
				req := couplet.Request{Mode: couplet.ModeLower, Text: u, N: 1, Seed: *seed + uint64(i), Unconstrained: v.raw}
				req.SetTemperature(*temperature) // 0 = greedy
				if v.g.Validate(req) != nil {
					continue // unknown characters or too long for the model
				}
				t0 := time.Now()
				cs, err := v.g.Generate(ctx, req)
				d := time.Since(t0)
				if err != nil || len(cs) == 0 {
					s.errs++
					continue
				}
				s.add(cs[0], "", true, d)
			}
			pr.done()
			rows = append(rows, s)
		}
	}

	// Greedy lower-mode BLEU, constraints off vs on, same pairs. Pairs the
	// model cannot take (unknown characters, too long) are skipped in both.
	type bleuRow struct {
		name       string
		n          int
		b4, b2     float64
		meanLatent time.Duration
	}
	var bleuRows []bleuRow
	if terr == nil && len(bleuU) > 0 {
		for _, v := range []variant{variants[0], variants[1]} {
			var hyps, refs []string
			var lat []time.Duration
			name := "unconstrained"
			if !v.raw {
				name = "constrained"
			}
			pr := newEvalProgress("greedy BLEU · "+name, len(bleuU))
			for i, u := range bleuU {
				pr.tick(i)
				req := couplet.Request{Mode: couplet.ModeLower, Text: u, N: 1, TopK: 1, Seed: *seed + uint64(i), Temperature: float32(*temperature), Unconstrained: v.raw}
				if v.g.Validate(req) != nil {
					continue
				}
				t0 := time.Now()
				cs, err := v.g.Generate(ctx, req)
				lat = append(lat, time.Since(t0))
				hyp := ""
				if err == nil && len(cs) > 0 {
					hyp = cs[0].Lower
				}
				hyps = append(hyps, hyp)
				refs = append(refs, bleuL[i])
			}
			pr.done()
			bleuRows = append(bleuRows, bleuRow{name, len(hyps), quality.BLEU(hyps, refs, 4), quality.BLEU(hyps, refs, 2), mean(lat)})
		}
	}

	// docs/EVAL.md's BLEU (length forced), the same check for BLEU.
	var forcedHyps []string
	if terr == nil && len(forcedU) > 0 {
		pr := newEvalProgress("greedy BLEU, length forced", len(forcedU))
		var err error
		if forcedHyps, err = quality.LowerGreedy(st.Model, forcedU, pr.tick); err != nil {
			return fmt.Errorf("forced-length BLEU: %w", err)
		}
		pr.done()
	}

	// Teacher-forced 下联 perplexity, the Go forward pass's own check of
	// the Python side's figure.
	var pplNLL float64
	var pplTokens int
	if terr == nil && len(pplU) > 0 {
		pr := newEvalProgress("teacher-forced perplexity", len(pplU))
		t0 := time.Now()
		var err error
		if pplNLL, pplTokens, err = quality.LowerNLL(st.Model, pplU, pplL, pr.tick); err != nil {
			return fmt.Errorf("perplexity: %w", err)
		}
		pr.done()
		fmt.Fprintf(os.Stderr, "chunlian eval: perplexity over %d tokens in %.1fs\n", pplTokens, time.Since(t0).Seconds())
	}

	w := stdout
	fmt.Fprintln(w, "## Constrained decoding (Go engine)")
	fmt.Fprintln(w)
	tflag := ""
	if *temperature != couplet.DefaultTemperature {
		tflag = fmt.Sprintf(" --temperature %g", *temperature)
	}
	fmt.Fprintf(w, "Model `%s`, %s engine, %s backend. Reproduce: `go run ./cmd/chunlian eval --seed %d --limit %d --bleu-limit %d --samples-per-couplet %d%s` (one request at a time, N = 1, temperature %g, top-p %.2f; the constrained runs draw %d sample(s) per couplet and rank them; in keyword mode even samples let the model place the keyword, odd ones put it first).\n\n",
		st.Model.Name, sc.Engine, sc.Backend, *seed, *limit, *bleuLimit, st.Config.SamplesPerCouplet, tflag, *temperature, couplet.DefaultTopP, st.Config.SamplesPerCouplet)
	fmt.Fprintln(w, "| set · decoding | couplets | rule 1 form | rule 2 仄起平收 | rule 3 same-char/mirror | rule 4 横批 | all rules | keyword present | failed | latency mean / p50 / p90 (ms) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, s := range rows {
		kw := "–"
		if strings.HasPrefix(s.name, "keyword") {
			kw = pct(s.kw, s.n)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %d | %s / %s / %s |\n", s.name, s.n,
			pct(s.r1, s.n), pct(s.r2, s.n), pct(s.r3, s.n), pct(s.r4, s.n), pct(s.all, s.n), kw, s.errs,
			ms(mean(s.lat)), ms(quantile(s.lat, 0.5)), ms(quantile(s.lat, 0.9)))
	}
	fmt.Fprintln(w)
	if len(rows) >= 3 && rows[0].n > 0 {
		fmt.Fprintf(w, "Cost of the constraints (keyword mode, mean latency per couplet): %s ms unconstrained → %s ms constrained (model 横批 only) → %s ms with 横批 retrieval + ranking (%d retrieval candidates loaded).\n\n",
			ms(mean(rows[0].lat)), ms(mean(rows[1].lat)), ms(mean(rows[2].lat)), full.NumBanners())
	}
	if len(bleuRows) > 0 {
		fmt.Fprintf(w, "Greedy 下联 (top-k 1) in lower mode on the first %d test.tsv pairs (pairs with characters unknown to the model skipped), corpus BLEU over characters, uniform weights, no smoothing, brevity penalty. Unconstrained output is the text up to the first special token, so it may be shorter or longer than the 上联.\n\n", len(bleuU))
		fmt.Fprintln(w, "| greedy lower mode | pairs | BLEU-4 | BLEU-2 | mean latency (ms) |")
		fmt.Fprintln(w, "|---|---|---|---|---|")
		for _, b := range bleuRows {
			fmt.Fprintf(w, "| %s | %d | %.4f | %.4f | %s |\n", b.name, b.n, b.b4, b.b2, ms(b.meanLatent))
		}
		fmt.Fprintln(w)
	}
	if len(forcedHyps) > 0 {
		b4 := quality.BLEU(forcedHyps, forcedL, 4)
		lo, hi := quality.BLEUInterval(forcedHyps, forcedL, 4, bleuResamples, 0.95, 1)
		fmt.Fprintf(w, "BLEU as docs/EVAL.md defines it (greedy 下联 of exactly the 上联's length, special tokens forbidden, corpus BLEU over characters) on the first %d test.tsv pairs, computed by the Go CPU forward pass: BLEU-4 **%.6f** (95 %% bootstrap interval over the pairs, %d resamples: %.4f–%.4f), BLEU-2 %.6f.\n\n",
			len(forcedHyps), b4, bleuResamples, lo, hi, quality.BLEU(forcedHyps, forcedL, 2))
		if *bleuOut != "" {
			if err := writeTriples(*bleuOut, forcedU, forcedL, forcedHyps); err != nil {
				return err
			}
		}
		if *bleuCompare != "" {
			other, err := readHyps(*bleuCompare, forcedU, forcedL)
			if err != nil {
				return err
			}
			ob4 := quality.BLEU(other, forcedL, 4)
			lo, hi, higher := quality.BLEUDiff(other, forcedHyps, forcedL, 4, bleuResamples, 0.95, 1)
			fmt.Fprintf(w, "Against `%s` on the same pairs: BLEU-4 %+.6f (this model %.6f, that one %.6f); paired bootstrap, %d resamples: 95 %% interval %+.4f to %+.4f, this model higher in %.1f %% of resamples.\n\n",
				*bleuCompare, b4-ob4, b4, ob4, bleuResamples, lo, hi, 100*higher)
		}
	}
	if pplTokens > 0 {
		fmt.Fprintf(w, "Teacher-forced 下联 perplexity (docs/EVAL.md's definition: the 下联 characters + `<eos>` of `<bos> <low> <len_N> <up> 上联 <sep> 下联 <eos>`, unknown characters as `<unk>`) on the first %d test.tsv pairs, computed by the Go CPU forward pass: **%.3f** (NLL %.4f nats per token over %d tokens).\n\n",
			len(pplU), math.Exp(pplNLL/float64(pplTokens)), pplNLL/float64(pplTokens), pplTokens)
	}
	fmt.Fprintln(w, "Rule definitions (`couplet.Check`): rule 1 = same length, punctuation at the same positions, only Chinese characters elsewhere; rule 2 = 上联 ends on 仄 and 下联 on 平 (modern tones, primary reading via go-pinyin) — in lower mode only the 下联's 平 ending is counted, since the 上联 is given; rule 3 = no identical character at the same position and mirrored repetition; rule 4 = 横批 of exactly four Chinese characters. \"failed\" counts requests that returned an error (constrained: every attempt dead-ended).")
	for _, s := range rows {
		if strings.HasPrefix(s.name, "lower") && s.n > 0 {
			fmt.Fprintf(w, "\nIn the lower-mode rows, %s of the given test 上联s themselves end on 仄.\n", pct(s.upperZeGiven, s.n))
			break
		}
	}
	if len(skipped) > 0 {
		fmt.Fprintf(w, "\nWords skipped (characters unknown to the model): %s.\n", strings.Join(skipped, " "))
	}
	if testNote != "" {
		fmt.Fprintf(w, "\n%s\n", testNote)
	}
	if len(examples) > 0 {
		fmt.Fprint(w, "\nSample constrained couplets (keyword mode):\n\n")
		fmt.Fprintln(w, "| keyword | 上联 | 下联 | 横批 |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for i, c := range examples {
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", evalWords[i], c.Upper, c.Lower, c.Banner)
		}
	}
	return nil
}

// evalProgress prints "label: i/n" to stderr at most every 2 seconds, so a
// long evaluation (thousands of requests, one at a time) shows it is moving.
type evalProgress struct {
	label string
	n     int
	start time.Time
	last  time.Time
}

func newEvalProgress(label string, n int) *evalProgress {
	now := time.Now()
	return &evalProgress{label: label, n: n, start: now, last: now}
}

// tick is called before item i (0-based) starts.
func (p *evalProgress) tick(i int) {
	if time.Since(p.last) >= 2*time.Second {
		p.last = time.Now()
		fmt.Fprintf(os.Stderr, "chunlian eval: %s: %d/%d (%.0fs)\n", p.label, i, p.n, time.Since(p.start).Seconds())
	}
}

func (p *evalProgress) done() {
	fmt.Fprintf(os.Stderr, "chunlian eval: %s: %d/%d done in %.1fs\n", p.label, p.n, p.n, time.Since(p.start).Seconds())
}
