package main

// blind.go: the blind reading kit and the automatic signals of
// `chunlian eval` (package quality does the work; this file only wires
// flags to it). eval runs the kit when --blind, --score or --signals is
// given, the constraint evaluation otherwise.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/spf13/pflag"

	"chunlian/couplet"
	"chunlian/critic"
	"chunlian/quality"
)

// readerFlags are eval's flags of the reader's kit (--length, --seed and
// --random-model are eval's own and shared).
type readerFlags struct {
	blind                  *int
	sheetOut, keyOut       *string
	score, key             *string
	signals                *bool
	signalsOut             *string
	perWord                *int
	wordList, sharedFolder *string
	freshWords             *int
	readings               *string
}

// defineReader registers the kit's flags on eval's flag set.
func defineReader(fs *pflag.FlagSet) *readerFlags {
	return &readerFlags{
		blind:        fs.Int("blind", 0, "write a blind reading sheet of N couplets, half chunlian's (keyword mode), half human spring couplets of the same words"),
		sheetOut:     fs.String("sheet-out", "", "--blind: the sheet to write"),
		keyOut:       fs.String("key-out", "", "--blind: the key to write (id → source, word); keep it from the reader"),
		score:        fs.String("score", "", "score a filled sheet (with --key): hang / acceptable / odd and 横批 fit per side"),
		key:          fs.String("key", "", "--score: the sheet's key"),
		signals:      fs.Bool("signals", false, "automatic signals of chunlian's couplets and human ones of the same words, side by side (Markdown)"),
		signalsOut:   fs.String("signals-out", "", "--signals: also write the couplets compared, as source<TAB>word<TAB>上联<TAB>下联<TAB>横批 lines"),
		perWord:      fs.Int("per-word", 100, "--signals: chunlian couplets per blessing word (distinct-2 is over these); human ones: all of the word's, at most as many"),
		wordList:     fs.String("word-list", strings.Join(quality.BlessingWords[:15], ","), "--blind, --signals: comma-separated blessing words"),
		sharedFolder: fs.String("shared", "../shared/data", "--blind, --signals: the shared data folder (spring/, couplets/train.tsv)"),
		freshWords:   fs.Int("fresh-words", 0, "list N two-character blessing words for a held-out reading: dictionary words, festive, held by human spring couplets of --length, named by no recorded reading or training file (--readings)"),
		readings:     fs.String("readings", "quality/testdata/readings,training/data/written_triples.tsv", "--fresh-words: comma-separated recorded readings and training files (folders or files) whose words count as used"),
	}
}

// active reports whether the call asks for the kit rather than the
// constraint evaluation.
func (r *readerFlags) active() bool {
	return *r.blind != 0 || *r.score != "" || *r.signals || *r.freshWords != 0
}

// runReader runs `eval --blind N --sheet-out F --key-out K`,
// `eval --score SHEET --key K` or `eval --signals`.
// temp is eval's --temperature for the couplets --blind and --signals
// generate (nil: not given, the stack's default).
func runReader(sc stackConfig, r *readerFlags, length int, seed uint64, temp *float64, randomModel bool, stdout io.Writer) error {
	if *r.score != "" {
		return scoreSheetFiles(*r.score, *r.key, stdout)
	}
	if *r.freshWords != 0 {
		return freshWords(*r.freshWords, strings.Split(*r.readings, ","), *r.sharedFolder, length, stdout)
	}
	if *r.blind < 0 {
		return errors.New("--blind needs N > 0")
	}
	if temp != nil {
		// The HTTP API's range check, as evalRun's (quality.EvalOptions.Validate).
		if err := couplet.Limits.Validate(couplet.Request{Temperature: float32(*temp)}); err != nil {
			return fmt.Errorf("--temperature %g: %w", *temp, err)
		}
	}
	shared := *r.sharedFolder
	words := strings.Split(*r.wordList, ",")
	pool, err := readHumanSpring(shared)
	if err != nil {
		return err
	}
	st, err := openStack(sc, randomModel)
	if err != nil {
		return err
	}
	defer st.Close()
	g := st.Gen
	rng := rand.New(rand.NewPCG(seed, 1))
	if *r.blind > 0 {
		if *r.sheetOut == "" || *r.keyOut == "" {
			return errors.New("--blind needs --sheet-out and --key-out")
		}
		return writeBlind(g, pool, words, *r.blind, length, seed, temp, rng, *r.sheetOut, *r.keyOut, stdout)
	}
	return writeSignals(g, pool, signalsConfig{words, *r.perWord, length, seed, temp, shared, *r.signalsOut, st.Config.SamplesPerCouplet}, rng, stdout)
}

func scoreSheetFiles(sheetPath, keyPath string, stdout io.Writer) error {
	if keyPath == "" {
		return errors.New("--score needs --key")
	}
	sheet, err := os.Open(sheetPath)
	if err != nil {
		return err
	}
	defer sheet.Close()
	key, err := os.Open(keyPath)
	if err != nil {
		return err
	}
	defer key.Close()
	scores, err := quality.ScoreSheet(sheet, key)
	if err != nil {
		return err
	}
	quality.WriteScores(stdout, scores)
	return nil
}

// generateFor draws n keyword-mode couplets per word at the request
// defaults (seed base+1000·word index+k), eight requests at a time.
func generateFor(g *couplet.Generator, words []string, n, length int, base uint64, temp *float64) ([]quality.Couplet, error) {
	out := make([]quality.Couplet, len(words)*n)
	errs := make([]error, len(out))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for wi, w := range words {
		for k := 0; k < n; k++ {
			i := wi*n + k
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				req := couplet.Request{Mode: couplet.ModeKeyword, Text: w, Length: length, N: 1, Seed: base + uint64(1000*wi+k)}
				if temp != nil {
					req.SetTemperature(*temp) // 0 = greedy, as over HTTP
				}
				cs, err := g.Generate(context.Background(), req)
				if err != nil || len(cs) == 0 {
					errs[i] = fmt.Errorf("%s (seed %d): %v", w, req.Seed, err)
					return
				}
				out[i] = quality.Couplet{Source: quality.SourceOurs, Word: w, Upper: cs[0].Upper, Lower: cs[0].Lower, Banner: cs[0].Banner}
			}()
		}
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// writeBlind writes a sheet of n rows: n/2 of ours and n/2 human, over
// the words that have enough human couplets of the length.
func writeBlind(g *couplet.Generator, pool []quality.Couplet, words []string, n, length int, seed uint64, temp *float64, rng *rand.Rand, sheetPath, keyPath string, stdout io.Writer) error {
	half := n / 2
	var usable []string
	human := map[string][]quality.Couplet{}
	for _, w := range words {
		if hs := quality.HumanFor(pool, w, length, half, rng); len(hs) > 0 {
			usable = append(usable, w)
			human[w] = hs
		}
	}
	if len(usable) == 0 {
		return fmt.Errorf("no human couplet of %d characters holds any of %v", length, words)
	}
	per := (half + len(usable) - 1) / len(usable)
	ours, err := generateFor(g, usable, per, length, seed, temp)
	if err != nil {
		return err
	}
	// Round-robin over the words; a human couplet that holds several of
	// the words is used once, and so is a line that two variants share.
	var pickedOurs, pickedHuman []quality.Couplet
	used := map[string]bool{}
	next := make([]int, len(usable)) // per word: next human candidate
	var picked []string
	for k := 0; k < per && len(pickedOurs) < half; k++ {
		for w := 0; w < len(usable) && len(pickedOurs) < half; w++ {
			hs := human[usable[w]]
			for next[w] < len(hs) && (used[hs[next[w]].Upper] || used[hs[next[w]].Lower]) {
				next[w]++
			}
			if next[w] == len(hs) {
				continue
			}
			h := hs[next[w]]
			used[h.Upper], used[h.Lower] = true, true
			pickedOurs = append(pickedOurs, ours[w*per+k])
			pickedHuman = append(pickedHuman, h)
			if !slices.Contains(picked, usable[w]) {
				picked = append(picked, usable[w])
			}
		}
	}
	sheet, err := os.Create(sheetPath)
	if err != nil {
		return err
	}
	defer sheet.Close()
	key, err := os.Create(keyPath)
	if err != nil {
		return err
	}
	defer key.Close()
	if err := quality.WriteBlindSheet(sheet, key, pickedOurs, pickedHuman, seed); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (%d couplets: %d chunlian, %d human, words %s) and its key %s\n", sheetPath, len(pickedOurs)+len(pickedHuman), len(pickedOurs), len(pickedHuman), strings.Join(picked, " "), keyPath)
	return nil
}

// signalsConfig is the --signals run's settings.
type signalsConfig struct {
	words             []string
	perWord, length   int
	seed              uint64
	temp              *float64 // nil: the stack's default temperature
	shared, out       string
	samplesPerCouplet int
}

func writeSignals(g *couplet.Generator, pool []quality.Couplet, c signalsConfig, rng *rand.Rand, stdout io.Writer) error {
	critic.Load()
	ours, err := generateFor(g, c.words, c.perWord, c.length, c.seed, c.temp)
	if err != nil {
		return err
	}
	var human []quality.Couplet
	used := map[string]bool{} // a human couplet that holds two of the words counts for the first
	for _, w := range c.words {
		for _, h := range quality.HumanFor(pool, w, c.length, c.perWord, rng) {
			if !used[h.Upper+h.Lower] {
				used[h.Upper+h.Lower] = true
				human = append(human, h)
			}
		}
	}
	if c.out != "" {
		var b strings.Builder
		for _, x := range append(append([]quality.Couplet(nil), ours...), human...) {
			fmt.Fprintf(&b, "%s\t%s\t%s\t%s\t%s\n", x.Source, x.Word, x.Upper, x.Lower, x.Banner)
		}
		if err := os.WriteFile(c.out, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	real := realBanners(c.shared)
	train, err := readTrainPairs(filepath.Join(c.shared, "couplets/train.tsv"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "chunlian eval: copied share skipped: %v\n", err)
	}
	temp := "the default temperature"
	if c.temp != nil {
		temp = fmt.Sprintf("--temperature %g", *c.temp)
	}
	fmt.Fprintf(stdout, "Automatic signals, keyword mode, %d-character lines, words %s; chunlian: %d couplets per word (--samples-per-couplet %d, %s, seed %d); human: the spring couplets of ../shared that hold the word, of the same length (one that holds two of the words counts for the first).\n\n",
		c.length, strings.Join(c.words, " "), c.perWord, c.samplesPerCouplet, temp, c.seed)
	quality.WriteSignals(stdout, []quality.Signals{
		quality.ComputeSignals(quality.SourceOurs, ours, real, train),
		quality.ComputeSignals(quality.SourceHuman, human, real, train),
	})
	return nil
}

// realBanners is the test of "a real phrase": the service's curated list
// (couplet.BannerList, the only source of chunlian's 横批) and the 横批 people
// hung (spring/with_banner.tsv's third column), so a human 横批 is real by
// construction. Idiom lists are not enough: they hold variants that are
// not 横批 (安家乐业).
func realBanners(shared string) func(string) bool {
	set := map[string]bool{}
	for _, b := range couplet.BannerList() {
		set[b] = true
	}
	if f, err := os.Open(filepath.Join(shared, "spring/with_banner.tsv")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if c := strings.Split(sc.Text(), "\t"); len(c) == 3 {
				set[strings.TrimSpace(c[2])] = true
			}
		}
		f.Close()
	}
	return func(b string) bool { return set[b] }
}

func readTrainPairs(p string) (map[string]bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	set := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if u, l, ok := strings.Cut(sc.Text(), "\t"); ok {
			set[u+"\t"+l] = true
		}
	}
	return set, sc.Err()
}

// readHumanSpring reads the human spring couplets of the shared folder
// (quality.ReadHuman over its triples and pairs).
func readHumanSpring(shared string) ([]quality.Couplet, error) {
	pool, err := quality.ReadHuman(filepath.Join(shared, "spring/with_banner.tsv"), filepath.Join(shared, "spring/newyear_no_banner.tsv"))
	if err != nil {
		return nil, fmt.Errorf("the human couplets need ../shared (--shared): %w", err)
	}
	return pool, nil
}

// freshWords prints `eval --fresh-words N`: word<TAB>human couplets per
// line. At least 3 human couplets per word, so that the sheet can pair
// each word's two couplets with people's.
func freshWords(n int, readings []string, shared string, length int, stdout io.Writer) error {
	if n < 0 {
		return errors.New("--fresh-words needs N > 0")
	}
	used := map[string]bool{}
	for _, path := range readings {
		u, err := quality.UsedWords(path)
		if err != nil {
			return fmt.Errorf("--readings: %w", err)
		}
		for w := range u {
			used[w] = true
		}
	}
	pool, err := readHumanSpring(shared)
	if err != nil {
		return err
	}
	// A dictionary word (one segment of a known class), festive, nothing
	// unsuitable, and no year animal (金猴 and 玉兔 belong to one year).
	ok := func(w string) bool {
		ws := critic.SegmentDict(w)
		return len(ws) == 1 && ws[0].Class != critic.ClassUnknown && !strings.ContainsFunc(w, critic.IsYearAnimal) &&
			critic.Festive(w) > 0 && len(critic.Unsuitable(w)) == 0
	}
	words := quality.FreshWords(pool, length, n, 3, used, ok)
	for _, wc := range words {
		fmt.Fprintf(stdout, "%s\t%d\n", wc.Word, wc.Human)
	}
	fmt.Fprintf(stdout, "# %d words (%d asked); %d runs of two or four characters in %s counted as used\n", len(words), n, len(used), strings.Join(readings, ", "))
	return nil
}
