package main

// generate.go: `chunlian generate` writes couplets from the command line on
// the same stack as the service (model → backend → engine → couplet).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"chunlian/couplet"
	"chunlian/model"
)

// genFlags are the couplet-request flags shared by generate and eval.
type genFlags struct {
	mode          string
	n, length     int
	seed          uint64
	temperature   float64
	fs            *pflag.FlagSet // to tell a --temperature given from none
	topP          float64
	topK          int
	unconstrained bool
}

func (g *genFlags) register(fs *pflag.FlagSet) {
	l := couplet.Limits
	fs.StringVar(&g.mode, "mode", "keyword", "keyword | acrostic (藏头) | lower (TEXT is the 上联)")
	fs.IntVar(&g.n, "n", 1, fmt.Sprintf("number of candidates (%d..%d)", l.MinN, l.MaxN))
	fs.IntVar(&g.length, "length", couplet.DefaultLength, fmt.Sprintf("Chinese characters per line (keyword/acrostic, %d..%d); 8 and more are split by \"，\" (11 = 4，7)", l.MinLength, l.MaxLength))
	fs.Uint64Var(&g.seed, "seed", 0, "random seed (0 = random)")
	g.fs = fs
	fs.Float64Var(&g.temperature, "temperature", 0, fmt.Sprintf("sampling temperature (0..%g; 0 = greedy); not given: %g", l.MaxTemperature, couplet.DefaultTemperature))
	fs.Float64Var(&g.topP, "top-p", couplet.DefaultTopP, "nucleus sampling threshold (0 < p ≤ 1)")
	fs.IntVar(&g.topK, "top-k", 0, "top-k sampling (0 = off, 1 = greedy)")
	fs.BoolVar(&g.unconstrained, "unconstrained", false, "turn the couplet rules off (raw model output, for comparison)")
}

func (g *genFlags) request(text string) couplet.Request {
	r := couplet.Request{
		Mode: couplet.Mode(g.mode), Text: text, Length: g.length, N: g.n, Seed: g.seed,
		TopP: float32(g.topP), TopK: g.topK, Unconstrained: g.unconstrained,
	}
	if g.fs == nil || g.fs.Changed("temperature") {
		r.SetTemperature(g.temperature) // 0 = greedy
	} // else unset: the generator's default (--default-temperature)
	return r
}

// bannerSources lists the 横批 list for the generator: bannersFile when set
// (an operator's own curated list), else the embedded curated list. A
// model directory's banner_candidates.txt (idioms, used in training) is
// not a 横批 list: idioms include variants that are not 横批.
func bannerSources(bannersFile string) []couplet.BannerSource {
	if bannersFile != "" {
		return []couplet.BannerSource{{Path: bannersFile, Prior: 1}}
	}
	return couplet.DefaultBannerSources()
}

// jsonCouplet is one --json output line.
type jsonCouplet struct {
	Mode    string  `json:"mode"`
	Keyword string  `json:"keyword,omitempty"`
	Upper   string  `json:"upper"`
	Lower   string  `json:"lower"`
	Banner  string  `json:"banner"`
	Score   float64 `json:"score"`
}

// generateOpts are generate's flags.
type generateOpts struct {
	gen         genFlags
	stack       stackConfig
	asJSON      bool
	explain     bool
	randomModel bool
}

// jsonCandidate is one --explain output line: a ranked candidate.
type jsonCandidate struct {
	Candidate string           `json:"candidate"` // 上联 / 下联
	Features  couplet.Features `json:"features"`
	Score     float64          `json:"score"`
	Chosen    bool             `json:"chosen"`
}

// newGenerateCmd builds `chunlian generate`; couplets go to stdout.
func newGenerateCmd(stdout io.Writer) *cobra.Command {
	var o generateOpts
	cmd := &cobra.Command{
		Use:   "generate [flags] TEXT",
		Short: "write couplets for a blessing word (or the 下联 for a 上联)",
		Long: `Write couplets on the same stack as the service.

TEXT is a two-character blessing word (modes keyword and acrostic) or a
上联 (mode lower). Flags may come before or after TEXT.`,
		Example: "  chunlian generate 平安\n  chunlian generate 平安 --n 3 --json\n  chunlian generate --mode lower 春风送暖入屠苏",
		Args:    exactArgs(1, "TEXT"),
		RunE: func(_ *cobra.Command, args []string) error {
			return generateRun(o, args[0], stdout)
		},
	}
	fs := cmd.Flags()
	o.gen.register(fs)
	fs.BoolVar(&o.asJSON, "json", false, "print one JSON object per couplet and line: mode, keyword, upper, lower, banner, score")
	fs.BoolVar(&o.explain, "explain", false, "after the couplets, print every ranked candidate as one JSON object per line: candidate, features (the reverse score too), score, chosen")
	fs.BoolVar(&o.randomModel, "random-model", false, "use the tiny random test model (for smoke tests; output is gibberish)")
	o.stack.registerModel(fs)
	return withEnv(cmd)
}

// runGenerate parses args as `chunlian generate` would and runs it.
func runGenerate(args []string, stdout io.Writer) error {
	return execute(newGenerateCmd(stdout), args)
}

func generateRun(o generateOpts, text string, stdout io.Writer) error {
	gf, asJSON := o.gen, &o.asJSON
	req := gf.request(text)
	if err := couplet.Limits.Validate(req); err != nil {
		return err // before loading the model
	}
	st, err := openStack(o.stack, o.randomModel)
	if err != nil {
		return err
	}
	defer st.Close()
	if o.explain {
		req.Trace = &couplet.Trace{Explain: true}
	}
	cs, err := st.Gen.Generate(context.Background(), req)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	for i, c := range cs {
		if *asJSON {
			j := jsonCouplet{Mode: gf.mode, Upper: c.Upper, Lower: c.Lower, Banner: c.Banner, Score: c.Score}
			if req.Mode == couplet.ModeKeyword || req.Mode == "" {
				j.Keyword = couplet.Normalize(req.Text)
			}
			if err := enc.Encode(j); err != nil {
				return err
			}
			continue
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintln(stdout, c.Text())
		if len(cs) > 1 {
			fmt.Fprintf(stdout, "(score %.3f)\n", c.Score)
		}
	}
	if req.Trace != nil {
		for _, c := range req.Trace.Candidates {
			if err := enc.Encode(jsonCandidate{c.Upper + " / " + c.Lower, c.Features, c.Score, c.Chosen}); err != nil {
				return err
			}
		}
	}
	return nil
}

// openStack builds the shared stack, on the random test model if asked.
func openStack(sc stackConfig, random bool) (*stack, error) {
	if !random {
		return buildStack(sc)
	}
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	return buildStackFor(sc, model.NewRandom(model.TestConfig(), 1), nil)
}
