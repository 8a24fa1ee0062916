package main

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"chunlian/couplet"
)

// TestGenerateCommand runs `chunlian generate --json` on the random test
// model and checks each line is a well-formed couplet with the keyword.
func TestGenerateCommand(t *testing.T) {
	var out bytes.Buffer
	if err := runGenerate([]string{"--random-model", "--json", "--n", "2", "--seed", "5", "--length", "5", "平安"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d JSON lines, want 2:\n%s", len(lines), out.String())
	}
	for _, l := range lines {
		var j jsonCouplet
		if err := json.Unmarshal([]byte(l), &j); err != nil {
			t.Fatal(err)
		}
		c := couplet.Couplet{Upper: j.Upper, Lower: j.Lower, Banner: j.Banner}
		if !couplet.Check(j.Upper, j.Lower, j.Banner).OK() || !couplet.ContainsKeyword(c, "平安") || j.Keyword != "平安" || len([]rune(j.Upper)) != 5 {
			t.Errorf("bad line %s", l)
		}
	}
	out.Reset()
	if err := runGenerate([]string{"--random-model", "--seed", "5", "--mode", "acrostic", "春福"}, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := couplet.ParseText(strings.TrimSpace(out.String())); err != nil {
		t.Errorf("text output %q: %v", out.String(), err)
	}
	if err := runGenerate([]string{"--random-model", "平"}, &out); err == nil {
		t.Error("one-character keyword accepted")
	}
}

// TestEvalCommand runs a tiny eval on the random test model.
func TestEvalCommand(t *testing.T) {
	var out bytes.Buffer
	if err := runEval([]string{"--random-model", "--words", "3", "--limit", "3", "--bleu-limit", "3", "--test", "testdata-absent.tsv"}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"## Constrained decoding (Go engine)", "| keyword (3 words) · constrained + 横批 ranking | 3 | 100.0% | 100.0% | 100.0% | 100.0% | 100.0% | 100.0% |", "test set skipped"} {
		if !strings.Contains(s, want) {
			t.Errorf("eval output lacks %q:\n%s", want, s)
		}
	}
}

// TestEvalTemperature: --temperature reaches the sampled runs (the report
// names it and its reproduce command carries it) and is range-checked.
func TestEvalTemperature(t *testing.T) {
	base := []string{"--random-model", "--words", "2", "--limit", "0", "--bleu-limit", "0", "--test", "testdata-absent.tsv"}
	var out bytes.Buffer
	if err := runEval(append(base, "--temperature", "0.55"), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--samples-per-couplet 1 --temperature 0.55`", "temperature 0.55, top-p"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("eval output lacks %q:\n%s", want, out.String())
		}
	}
	for _, bad := range []string{"0", "-1", "2.5", "NaN"} {
		if err := runEval(append(base, "--temperature", bad), io.Discard); err == nil {
			t.Errorf("--temperature %s: no error", bad)
		}
	}
}
