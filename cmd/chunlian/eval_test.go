package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	if err := runGenerate([]string{"--random-model", "平安福"}, &out); err == nil {
		t.Error("three-character keyword accepted")
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
	for _, want := range []string{fmt.Sprintf("--samples-per-couplet %d --temperature 0.55`", cpuDefaultSamples), "temperature 0.55, top-p"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("eval output lacks %q:\n%s", want, out.String())
		}
	}
	for _, bad := range []string{"-1", "2.5", "NaN"} { // 0 is greedy, as over HTTP
		if err := runEval(append(base, "--temperature", bad), io.Discard); err == nil {
			t.Errorf("--temperature %s: no error", bad)
		}
	}
}

// TestEvalBleuOut: --bleu-forced reports BLEU-4 with its bootstrap
// interval, and --bleu-out writes one 上联/reference/greedy line per pair,
// each greedy 下联 as long as its 上联 (docs/EVAL.md's definition).
func TestEvalBleuOut(t *testing.T) {
	dir := t.TempDir()
	test, hyps := filepath.Join(dir, "test.tsv"), filepath.Join(dir, "hyps.tsv")
	pairs := [][2]string{{"春风得意", "秋月无边"}, {"花开", "鸟语"}, {"山高水长", "海阔天空"}}
	var b strings.Builder
	for _, p := range pairs {
		b.WriteString(p[0] + "\t" + p[1] + "\n")
	}
	if err := os.WriteFile(test, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	args := []string{"--random-model", "--words", "1", "--limit", "0", "--bleu-limit", "0", "--test", test, "--bleu-forced", "3", "--bleu-out", hyps}
	if err := runEval(args, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "95 % bootstrap interval over the pairs, 1000 resamples: ") {
		t.Errorf("eval output lacks the BLEU interval:\n%s", out.String())
	}
	data, err := os.ReadFile(hyps)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != len(pairs) {
		t.Fatalf("--bleu-out has %d lines, want %d:\n%s", len(lines), len(pairs), data)
	}
	for i, l := range lines {
		f := strings.Split(l, "\t")
		if len(f) != 3 || f[0] != pairs[i][0] || f[1] != pairs[i][1] {
			t.Errorf("line %d = %q, want %s<TAB>%s<TAB>hypothesis", i, l, pairs[i][0], pairs[i][1])
			continue
		}
		if n, want := len([]rune(f[2])), len([]rune(f[0])); n != want {
			t.Errorf("line %d: hypothesis %q has %d characters, want %d", i, f[2], n, want)
		}
	}
}

// TestEvalBleuCompare: --bleu-compare reads another run's --bleu-out file
// and reports the paired difference (zero against the same model), and
// refuses a file for other pairs.
func TestEvalBleuCompare(t *testing.T) {
	dir := t.TempDir()
	test, hyps := filepath.Join(dir, "test.tsv"), filepath.Join(dir, "hyps.tsv")
	if err := os.WriteFile(test, []byte("春风得意\t秋月无边\n花开\t鸟语\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--random-model", "--words", "1", "--limit", "0", "--bleu-limit", "0", "--test", test, "--bleu-forced", "2"}
	if err := runEval(append(base, "--bleu-out", hyps), io.Discard); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runEval(append(base, "--bleu-compare", hyps), &out); err != nil {
		t.Fatal(err)
	}
	if want := "on the same pairs: BLEU-4 +0.000000"; !strings.Contains(out.String(), want) {
		t.Errorf("eval output lacks %q:\n%s", want, out.String())
	}
	other := filepath.Join(dir, "other.tsv")
	if err := os.WriteFile(other, []byte("春风得意\t秋月无边\t秋月无边\n花落\t鸟语\t鸟语\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := runEval(append(base, "--bleu-compare", other), io.Discard); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("--bleu-compare with another pair on line 2: err = %v", err)
	}
}

// fakeShared writes a tiny shared data folder: one triple and one pair
// for 平安, a training file holding the pair, a banner list.
func fakeShared(t *testing.T, dir string) string {
	shared := filepath.Join(dir, "data")
	os.MkdirAll(filepath.Join(shared, "spring"), 0o755)
	os.MkdirAll(filepath.Join(shared, "couplets"), 0o755)
	os.WriteFile(filepath.Join(shared, "spring/with_banner.tsv"), []byte("岁岁平安福满门\t年年如意春盈室\t四季平安\n"), 0o644)
	os.WriteFile(filepath.Join(shared, "spring/newyear_no_banner.tsv"), []byte("平安二字值千金\t和顺一门有百福\n"), 0o644)
	os.WriteFile(filepath.Join(shared, "spring/banners.txt"), []byte("四季平安\n"), 0o644)
	os.WriteFile(filepath.Join(shared, "couplets/train.tsv"), []byte("平安二字值千金\t和顺一门有百福\n"), 0o644)
	return shared
}

// TestEvalReaderRoundTrip writes a blind sheet on the random test model
// and a small fake shared folder, fills it, and scores it.
func TestEvalReaderRoundTrip(t *testing.T) {
	dir := t.TempDir()
	shared := fakeShared(t, dir)
	sheet, key := filepath.Join(dir, "sheet.tsv"), filepath.Join(dir, "key.tsv")
	var out bytes.Buffer
	if err := runEval([]string{"--random-model", "--blind", "4", "--sheet-out", sheet, "--key-out", key, "--shared", shared, "--word-list", "平安"}, &out); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(sheet)
	var filled []string
	for _, l := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		f := strings.Split(l, "\t")
		if !strings.HasPrefix(l, "#") && f[0] != "id" {
			f[4] = "a"
			if f[3] != "n/a" {
				f[5] = "n"
			}
			l = strings.Join(f, "\t")
		}
		filled = append(filled, l)
	}
	if len(filled) != 9 { // 4 header lines, the column names, 4 rows
		t.Fatalf("sheet has %d lines, want 9:\n%s", len(filled), data)
	}
	os.WriteFile(sheet, []byte(strings.Join(filled, "\n")+"\n"), 0o644)
	out.Reset()
	if err := runEval([]string{"--score", sheet, "--key", key}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| chunlian | 2 | 0/2", "| human | 2 | 0/2 = 0 % (0–66) | 2/2 = 100 %"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("score report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestEvalSignalsTemperature: eval's --temperature reaches the couplets
// --signals writes (a run at the default and one at 0.5 write the same
// couplets, greedy ones differ), and an out-of-range one is refused.
func TestEvalSignalsTemperature(t *testing.T) {
	dir := t.TempDir()
	shared := fakeShared(t, dir)
	dump := func(extra ...string) string {
		t.Helper()
		path := filepath.Join(dir, fmt.Sprintf("c%d.tsv", len(extra)))
		args := append([]string{"--random-model", "--signals", "--per-word", "6", "--shared", shared, "--word-list", "平安", "--signals-out", path}, extra...)
		var out bytes.Buffer
		if err := runEval(args, &out); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	def, half, greedy := dump(), dump("--temperature", "0.5"), dump("--temperature", "0", "--seed", "1")
	if def != half {
		t.Errorf("--temperature 0.5 (the default) wrote other couplets than no flag:\n%s\n%s", def, half)
	}
	if greedy == def {
		t.Errorf("--temperature 0 wrote the default's couplets: the flag does not reach --signals")
	}
	var out bytes.Buffer
	err := runEval([]string{"--random-model", "--signals", "--shared", shared, "--temperature", "3"}, &out)
	if err == nil || !strings.Contains(err.Error(), "--temperature") {
		t.Errorf("--temperature 3 with --signals: err %v, want a --temperature error", err)
	}
}

// TestEvalSignals runs --signals on the random test model: both sides are
// reported, the human side is 1 of 2 copied from train.tsv and its 横批
// is real.
func TestEvalSignals(t *testing.T) {
	dir := t.TempDir()
	shared := fakeShared(t, dir)
	dump := filepath.Join(dir, "couplets.tsv")
	var out bytes.Buffer
	if err := runEval([]string{"--random-model", "--signals", "--per-word", "3", "--shared", shared, "--word-list", "平安", "--signals-out", dump}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| signal | chunlian | human |", "| couplets | 3 | 2 |", "| copied from training pairs | 0.0 % | 50.0 % |", "| 横批 a real phrase |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	data, err := os.ReadFile(dump)
	if err != nil || strings.Count(string(data), "\n") != 5 {
		t.Errorf("--signals-out wrote %q (%v), want 5 lines", data, err)
	}
}

// TestEvalFreshWords: --fresh-words lists words that three human couplets
// hold and no reading or training file names; a word one names is left out.
func TestEvalFreshWords(t *testing.T) {
	dir := t.TempDir()
	shared := fakeShared(t, dir)
	pairs := "家庭和睦春常在\t财富丰盈福自来\n幸福家庭添喜气\t财富人家纳吉祥\n家庭美满迎新岁\t财富兴隆庆有余\n"
	os.WriteFile(filepath.Join(shared, "spring/newyear_no_banner.tsv"), []byte(pairs), 0o644)
	readings := filepath.Join(dir, "readings")
	os.MkdirAll(readings, 0o755)
	os.WriteFile(filepath.Join(readings, "a.tsv"), []byte("# words: 财富\n"), 0o644)
	var out bytes.Buffer
	if err := runEval([]string{"--fresh-words", "5", "--shared", shared, "--readings", readings}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "家庭\t3\n") || strings.Contains(out.String(), "财富") {
		t.Errorf("--fresh-words: want 家庭 (3 couplets) and not 财富:\n%s", out.String())
	}
	// A training file's keyword column counts as used too.
	written := filepath.Join(dir, "written.tsv")
	os.WriteFile(written, []byte("家庭和睦春常在\t岁月安康福自来\t阖家欢乐\t家庭\n"), 0o644)
	out.Reset()
	if err := runEval([]string{"--fresh-words", "5", "--shared", shared, "--readings", readings + "," + written}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "家庭") {
		t.Errorf("--fresh-words with a training file naming 家庭: still listed:\n%s", out.String())
	}
}
