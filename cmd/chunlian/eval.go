package main

// eval.go: `chunlian eval` wires its flags to package quality: the
// constraint evaluation (quality.RunEval) by default, the reader's kit
// (blind.go) with --blind, --score or --signals.

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"chunlian/couplet"
	"chunlian/quality"
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

// defineEval registers eval's flags on fs and returns the run.
func defineEval(fs *pflag.FlagSet, stdout io.Writer) func() error {
	var o quality.EvalOptions
	fs.StringVar(&o.TestPath, "test", "../shared/data/couplets/test.tsv", "held-out upper<TAB>lower file for the lower-mode evaluation (skipped if absent)")
	fs.IntVar(&o.Limit, "limit", 300, "at most this many test.tsv 上联s (in file order)")
	words := fs.Int("words", len(quality.BlessingWords), fmt.Sprintf("use the first N of the %d built-in blessing words", len(quality.BlessingWords)))
	fs.IntVar(&o.Length, "length", couplet.DefaultLength, "line length in keyword mode")
	fs.Uint64Var(&o.Seed, "seed", 1, "base seed (request i uses seed+i)")
	fs.Float64Var(&o.Temperature, "temperature", 0, fmt.Sprintf("sampling temperature of the sampled keyword and lower-mode runs and of the couplets --blind and --signals write, 0..%g as in the HTTP API (0 = greedy; the BLEU runs are greedy); not given: %g", couplet.Limits.MaxTemperature, couplet.DefaultTemperature))
	fs.IntVar(&o.Samples, "samples", 8, "sample couplets to print")
	fs.IntVar(&o.BLEULimit, "bleu-limit", 300, "greedy lower-mode BLEU on this many test.tsv pairs, constraints on vs off (0 = skip)")
	fs.IntVar(&o.ForcedLimit, "bleu-forced", 0, "BLEU as docs/EVAL.md defines it (greedy, exactly as many characters as the 上联, special tokens forbidden) on this many test.tsv pairs, on a forward pass of its own on --backend (0 = skip; 3830 = the whole test set)")
	fs.StringVar(&o.BLEUOut, "bleu-out", "", "write the --bleu-forced pairs to this file as 上联<TAB>reference 下联<TAB>greedy 下联, one per line")
	fs.StringVar(&o.BLEUCompare, "bleu-compare", "", "a --bleu-out file of another model on the same pairs: report this model's BLEU-4 minus that one's, with a paired bootstrap interval")
	fs.IntVar(&o.PPLLimit, "ppl-limit", 0, "teacher-forced 下联 perplexity (docs/EVAL.md's definition) on this many test.tsv pairs, on a forward pass of its own on --backend (0 = skip; 3830 = the whole test set, as the Python side)")
	randomModel := fs.Bool("random-model", false, "use the tiny random test model (smoke test)")
	reader := defineReader(fs) // blind.go: --blind, --score, --signals
	var sc stackConfig
	sc.registerModel(fs)
	return func() error {
		if reader.active() {
			var temp *float64
			if fs.Changed("temperature") {
				temp = &o.Temperature
			}
			return runReader(sc, reader, o.Length, o.Seed, temp, *randomModel, stdout)
		}
		if *words < 1 || *words > len(quality.BlessingWords) {
			return fmt.Errorf("--words must be 1..%d", len(quality.BlessingWords))
		}
		o.Words = quality.BlessingWords[:*words]
		return evalRun(sc, o, !fs.Changed("temperature"), *randomModel, stdout)
	}
}

// evalRun builds the stack and runs the evaluation with o (with the
// stack's default temperature when defaultTemp).
func evalRun(sc stackConfig, o quality.EvalOptions, defaultTemp, randomModel bool, stdout io.Writer) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("eval: %w (--limit, --bleu-limit, --bleu-forced, --ppl-limit, --samples ≥ 0; --temperature as over HTTP)", err)
	}
	o.Progress = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "chunlian eval: "+format+"\n", args...)
	}
	st, err := openStack(sc, randomModel)
	if err != nil {
		return err
	}
	defer st.Close()
	if defaultTemp {
		o.Temperature = st.Config.DefaultTemperature
	}
	noRetr, err := st.newGenerator(couplet.WithBannerSources(), couplet.WithBannerTopK(0))
	if err != nil {
		return err
	}
	r, err := quality.RunEval(context.Background(), quality.EvalSetup{Full: st.Gen, NoRetrieval: noRetr, Model: st.Model, Lower: st.lowerBackend()}, o)
	if err != nil {
		return err
	}
	tflag := ""
	if o.Temperature != st.Config.DefaultTemperature {
		tflag = fmt.Sprintf(" --temperature %g", o.Temperature)
	}
	spc := st.Config.SamplesPerCouplet
	r.WriteMarkdown(stdout, fmt.Sprintf("Model `%s`, %s engine, %s backend. Reproduce: `go run ./cmd/chunlian eval --seed %d --limit %d --bleu-limit %d --samples-per-couplet %d%s` (one request at a time, N = 1, temperature %g, top-p %.2f; the constrained runs draw %d sample(s) per couplet and rank them; in keyword mode even samples let the model place the keyword, odd ones put it first).",
		st.Model.Name, sc.Engine, sc.Backend, o.Seed, o.Limit, o.BLEULimit, spc, tflag, o.Temperature, couplet.DefaultTopP, spc))
	return nil
}
