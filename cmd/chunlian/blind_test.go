package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEvalReaderRoundTrip writes a blind sheet on the random test model
// and a small fake shared folder, fills it, and scores it.
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
