package main

// generate.go: `chunlian generate` writes couplets from the command line on
// the same stack as the service (model → backend → engine → couplet).

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"chunlian/couplet"
	"chunlian/model"
)

func init() {
	commands["generate"] = command{
		summary: "write couplets for a blessing word (or the 下联 for a 上联)",
		run:     func(args []string) error { return runGenerate(args, os.Stdout) },
	}
}

// genFlags are the couplet-request flags shared by generate and eval.
type genFlags struct {
	mode          string
	n, length     int
	seed          uint64
	temperature   float64
	topP          float64
	topK          int
	unconstrained bool
}

func (g *genFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.mode, "mode", "keyword", "keyword | acrostic (藏头) | lower (TEXT is the 上联)")
	fs.IntVar(&g.n, "n", 1, fmt.Sprintf("number of candidates (1..%d)", couplet.MaxN))
	fs.IntVar(&g.length, "length", couplet.DefaultLength, "Chinese characters per line (keyword/acrostic); 8 and more are split by \"，\" (11 = 4，7)")
	fs.Uint64Var(&g.seed, "seed", 0, "random seed (0 = random)")
	fs.Float64Var(&g.temperature, "temperature", couplet.DefaultTemperature, "sampling temperature (use --top-k 1 for greedy)")
	fs.Float64Var(&g.topP, "top-p", couplet.DefaultTopP, "nucleus sampling threshold (0 < p ≤ 1)")
	fs.IntVar(&g.topK, "top-k", 0, "top-k sampling (0 = off, 1 = greedy)")
	fs.BoolVar(&g.unconstrained, "unconstrained", false, "turn the couplet rules off (raw model output, for comparison)")
}

func (g *genFlags) request(text string) couplet.Request {
	return couplet.Request{
		Mode: couplet.Mode(g.mode), Text: text, Length: g.length, N: g.n, Seed: g.seed,
		Temperature: float32(g.temperature), TopP: float32(g.topP), TopK: g.topK,
		Unconstrained: g.unconstrained,
	}
}

// bannerSources lists the 横批 retrieval lists for a model: the model
// directory's banner_candidates.txt when --model is given (the embedded
// model's own list is added by couplet.New), plus the shared corpus' list.
func bannerSources(modelDir string) []couplet.BannerSource {
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

func runGenerate(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: chunlian generate [flags] TEXT\n\nTEXT is a two-character blessing word (keyword, acrostic) or a 上联 (lower).\n\nflags:")
		fs.PrintDefaults()
	}
	var gf genFlags
	gf.register(fs)
	asJSON := fs.Bool("json", false, "print one JSON object per couplet and line: mode, keyword, upper, lower, banner, score")
	randomModel := fs.Bool("random-model", false, "use the tiny random test model (for smoke tests; output is gibberish)")
	var sc stackConfig
	sc.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("need exactly one TEXT argument")
	}
	st, err := openStack(sc, *randomModel)
	if err != nil {
		return err
	}
	defer st.Close()
	gen, err := couplet.New(st.Model, st.Engine, sc.generatorOptions()...)
	if err != nil {
		return err
	}
	req := gf.request(fs.Arg(0))
	cs, err := gen.Generate(context.Background(), req)
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
	return buildStackFor(sc, model.NewRandom(model.TestConfig(), 1))
}
