package quality

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"chunlian/couplet"
	"chunlian/engine"
	"chunlian/forward"
	"chunlian/model"
)

// testEvalSetup is the evaluation's setup on the random test model.
func testEvalSetup(t *testing.T) EvalSetup {
	t.Helper()
	m := model.NewRandom(model.TestConfig(), 1)
	be, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(be, engine.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(); be.Close() })
	full, err := couplet.New(m, eng, couplet.WithOversample(2))
	if err != nil {
		t.Fatal(err)
	}
	noRetr, err := couplet.New(m, eng, couplet.WithOversample(2), couplet.WithBannerSources(), couplet.WithBannerTopK(0))
	if err != nil {
		t.Fatal(err)
	}
	return EvalSetup{Full: full, NoRetrieval: noRetr, Model: m}
}

// TestEvalSamplesKeepTheirWord: a word the model cannot take is skipped
// and listed, and every sample row names the word its couplet was asked
// for (the constrained couplet holds it), not the word at its row number.
func TestEvalSamplesKeepTheirWord(t *testing.T) {
	words := []string{"𠀀𠀀", "平安", "富贵", "吉祥"} // the first: characters unknown to any vocabulary
	r, err := RunEval(context.Background(), testEvalSetup(t), EvalOptions{
		Words: words, Length: 5, Seed: 1, Temperature: couplet.DefaultTemperature, Samples: 8, TestPath: "absent.tsv",
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Skipped) != 1 || r.Skipped[0] != words[0] {
		t.Errorf("skipped %q, want [%s]", r.Skipped, words[0])
	}
	if len(r.Samples) != len(words)-1 {
		t.Fatalf("%d samples, want %d", len(r.Samples), len(words)-1)
	}
	for i, s := range r.Samples {
		if s.Keyword != words[i+1] || !couplet.ContainsKeyword(s.Couplet, s.Keyword) {
			t.Errorf("sample %d: keyword %q, couplet %s / %s; want %q in it", i, s.Keyword, s.Upper, s.Lower, words[i+1])
		}
	}
	var out bytes.Buffer
	r.WriteMarkdown(&out, "intro")
	for _, s := range r.Samples {
		if want := "| " + s.Keyword + " | " + s.Upper + " |"; !strings.Contains(out.String(), want) {
			t.Errorf("report lacks the row %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(out.String(), "Words skipped (characters unknown to the model): 𠀀𠀀.") || !strings.Contains(out.String(), "test set skipped: ") {
		t.Errorf("report lacks the skipped word or the test-set note:\n%s", out.String())
	}
}

// TestEvalOptionsValidate: counts and temperature are range-checked.
func TestEvalOptionsValidate(t *testing.T) {
	good := EvalOptions{Words: []string{"平安"}, Temperature: 0.7}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]EvalOptions{
		"no words":         {Temperature: 0.7},
		"negative limit":   {Words: good.Words, Limit: -1},
		"negative ppl":     {Words: good.Words, PPLLimit: -1},
		"temperature 2.5":  {Words: good.Words, Temperature: 2.5},
		"negative samples": {Words: good.Words, Samples: -1},
	} {
		if o.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
