package quality

// blind.go: the blind reading kit. A sheet mixes chunlian's couplets with
// human ones for the same blessing words, in seeded random order and
// without saying which is which; a person marks each row, and ScoreSheet
// turns the marks into rates per side with Wilson intervals.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"chunlian/couplet"
)

// The two sides of a sheet.
const (
	SourceOurs  = "chunlian"
	SourceHuman = "human"
)

// BannerNA fills the 横批 column of a row whose 横批 is not shown, and
// is the only mark accepted in its banner-fit column.
const BannerNA = "n/a"

// Couplet is one couplet of a sheet or a signals report. Banner is ""
// when the couplet has none (a human pair without 横批).
type Couplet struct {
	Source, Word         string
	Upper, Lower, Banner string
}

// ReadHuman reads the human spring couplets: the triples of withBanner
// (upper<TAB>lower<TAB>横批) and the pairs of pairs (upper<TAB>lower),
// a pair that is also a triple's kept once, as the triple. A couplet
// whose lines are reversed by the 仄/平 rule (上联 ends on 平, 下联 on 仄;
// about a tenth of the triples) is swapped. Word is left empty; Source is
// SourceHuman.
func ReadHuman(withBanner, pairs string) ([]Couplet, error) {
	var out []Couplet
	seen := map[string]bool{}
	for i, path := range []string{withBanner, pairs} {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			fs := strings.Split(sc.Text(), "\t")
			if len(fs) < 2 || seen[fs[0]+"\t"+fs[1]] || seen[fs[1]+"\t"+fs[0]] {
				continue
			}
			c := Couplet{Source: SourceHuman, Upper: fs[0], Lower: fs[1]}
			if i == 0 && len(fs) >= 3 {
				c.Banner = fs[2]
			}
			if r := couplet.Check(c.Upper, c.Lower, ""); !r.UpperZe && !r.LowerPing {
				c.Upper, c.Lower = c.Lower, c.Upper
			}
			seen[fs[0]+"\t"+fs[1]] = true
			out = append(out, c)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return out, nil
}

// HumanFor picks up to n human couplets that contain word (in a line or
// the 横批) and whose lines have length characters (0 = any), those with
// a 横批 first, the rest in an order drawn from rng; Word is set.
func HumanFor(pool []Couplet, word string, length, n int, rng *rand.Rand) []Couplet {
	var with, without []Couplet
	for _, c := range pool {
		if length > 0 && len([]rune(c.Upper)) != length {
			continue
		}
		if !strings.Contains(c.Upper, word) && !strings.Contains(c.Lower, word) && !strings.Contains(c.Banner, word) {
			continue
		}
		c.Word = word
		if c.Banner != "" {
			with = append(with, c)
		} else {
			without = append(without, c)
		}
	}
	rng.Shuffle(len(with), func(i, j int) { with[i], with[j] = with[j], with[i] })
	rng.Shuffle(len(without), func(i, j int) { without[i], without[j] = without[j], without[i] })
	out := append(with, without...)
	return out[:min(n, len(out))]
}

// WriteBlindSheet writes ours and human, shuffled together by seed, as a
// sheet (TSV: id, 上联, 下联, 横批, verdict, banner; a # header says how
// to fill it) and a key (TSV: id, source, word). Where k human couplets
// have no 横批, the 横批 of k of ours (drawn by seed) is hidden too
// (BannerNA), so that a missing 横批 does not give the side away.
func WriteBlindSheet(sheet, key io.Writer, ours, human []Couplet, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	rows := make([]Couplet, 0, len(ours)+len(human))
	missing := 0
	for _, c := range human {
		if c.Banner == "" {
			missing++
		}
	}
	hide := rng.Perm(len(ours))[:min(missing, len(ours))]
	ours = append([]Couplet(nil), ours...)
	for _, i := range hide {
		ours[i].Banner = ""
	}
	rows = append(append(rows, ours...), human...)
	rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	sw, kw := bufio.NewWriter(sheet), bufio.NewWriter(key)
	fmt.Fprintln(sw, "# Blind reading sheet. Read each couplet as a 春联 for a household's door.")
	fmt.Fprintln(sw, "# verdict: h = I would hang it, a = acceptable with reservations, o = odd (wrong, unnatural or unfit).")
	fmt.Fprintf(sw, "# banner: y = the 横批 fits the couplet and the door, n = it does not; %s where the 横批 column says %s.\n", BannerNA, BannerNA)
	fmt.Fprintln(sw, "# Fill the last two columns of every row (TAB-separated); leave everything else as it is.")
	fmt.Fprintln(sw, "id\t上联\t下联\t横批\tverdict\tbanner")
	fmt.Fprintln(kw, "id\tsource\tword")
	for i, c := range rows {
		b, fit := c.Banner, ""
		if b == "" {
			b, fit = BannerNA, BannerNA
		}
		fmt.Fprintf(sw, "%d\t%s\t%s\t%s\t\t%s\n", i+1, c.Upper, c.Lower, b, fit)
		fmt.Fprintf(kw, "%d\t%s\t%s\n", i+1, c.Source, c.Word)
	}
	if err := sw.Flush(); err != nil {
		return err
	}
	return kw.Flush()
}

// SideScore is one side's marks on a sheet.
type SideScore struct {
	Source                  string
	N                       int // rows
	Hang, Acceptable, Odd   int
	BannerRows, BannerFits  int // rows with a 横批 shown; of those marked y
	HangCI, AcceptCI, OddCI [2]float64
	BannerCI                [2]float64
}

// ScoreSheet reads a filled sheet and its key and returns the score of
// each side, in the order SourceOurs, SourceHuman, then any other source
// in key order. A row without a verdict, with an unknown mark, a banner
// mark missing where a 横批 is shown, or an id the key lacks is an error
// that names the sheet's line; so is a key id with no row.
func ScoreSheet(sheet, key io.Reader) ([]SideScore, error) {
	src, err := readKey(key)
	if err != nil {
		return nil, err
	}
	sides := map[string]*SideScore{}
	order := []string{SourceOurs, SourceHuman}
	for _, s := range order {
		sides[s] = &SideScore{Source: s}
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(sheet)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var errs []error
	for ln := 1; sc.Scan(); ln++ {
		l := strings.TrimRight(sc.Text(), "\r")
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "id\t") {
			continue
		}
		f := strings.Split(l, "\t")
		for len(f) < 6 {
			f = append(f, "")
		}
		id := strings.TrimSpace(f[0])
		s, ok := src[id]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("sheet line %d: id %q is not in the key", ln, id))
			continue
		case seen[id]:
			errs = append(errs, fmt.Errorf("sheet line %d: id %s appears twice", ln, id))
			continue
		}
		seen[id] = true
		if sides[s] == nil {
			sides[s] = &SideScore{Source: s}
			order = append(order, s)
		}
		if err := sides[s].mark(f[3], f[4], f[5]); err != nil {
			errs = append(errs, fmt.Errorf("sheet line %d (id %s): %w", ln, id, err))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for id := range src {
		if !seen[id] {
			errs = append(errs, fmt.Errorf("key id %s has no row in the sheet", id))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var out []SideScore
	for _, s := range order {
		sc := sides[s]
		sc.HangCI = Wilson(sc.Hang, sc.N, 0.95)
		sc.AcceptCI = Wilson(sc.Acceptable, sc.N, 0.95)
		sc.OddCI = Wilson(sc.Odd, sc.N, 0.95)
		sc.BannerCI = Wilson(sc.BannerFits, sc.BannerRows, 0.95)
		out = append(out, *sc)
	}
	return out, nil
}

// mark adds one row's marks: banner is the sheet's 横批 cell.
func (s *SideScore) mark(banner, verdict, fit string) error {
	switch strings.ToLower(strings.TrimSpace(verdict)) {
	case "h":
		s.Hang++
	case "a":
		s.Acceptable++
	case "o":
		s.Odd++
	case "":
		return errors.New("no verdict (h, a or o)")
	default:
		return fmt.Errorf("verdict %q is not h, a or o", verdict)
	}
	s.N++
	fit = strings.ToLower(strings.TrimSpace(fit))
	if strings.TrimSpace(banner) == BannerNA {
		if fit != BannerNA && fit != "" {
			return fmt.Errorf("banner mark %q where no 横批 is shown (leave %s)", fit, BannerNA)
		}
		return nil
	}
	s.BannerRows++
	switch fit {
	case "y":
		s.BannerFits++
	case "n":
	case "":
		return errors.New("no banner mark (y or n)")
	default:
		return fmt.Errorf("banner mark %q is not y or n", fit)
	}
	return nil
}

func readKey(r io.Reader) (map[string]string, error) {
	src := map[string]string{}
	sc := bufio.NewScanner(r)
	for ln := 1; sc.Scan(); ln++ {
		l := strings.TrimRight(sc.Text(), "\r")
		if l == "" || strings.HasPrefix(l, "id\t") || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Split(l, "\t")
		if len(f) < 2 || f[0] == "" || f[1] == "" {
			return nil, fmt.Errorf("key line %d: want id<TAB>source<TAB>word", ln)
		}
		if _, dup := src[f[0]]; dup {
			return nil, fmt.Errorf("key line %d: id %s appears twice", ln, f[0])
		}
		src[f[0]] = f[1]
	}
	return src, sc.Err()
}

// Wilson is the Wilson score interval of k successes in n trials at the
// given two-sided confidence (0.95 → z = 1.959964); [0, 0] when n = 0.
func Wilson(k, n int, confidence float64) [2]float64 {
	if n == 0 {
		return [2]float64{}
	}
	z := normalQuantile(1 - (1-confidence)/2)
	p, nf := float64(k)/float64(n), float64(n)
	d := 1 + z*z/nf
	c := (p + z*z/(2*nf)) / d
	h := z / d * math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf))
	return [2]float64{math.Max(0, c-h), math.Min(1, c+h)}
}

// normalQuantile inverts the standard normal CDF by bisection on erf.
func normalQuantile(q float64) float64 {
	lo, hi := -10.0, 10.0
	for i := 0; i < 100; i++ {
		m := (lo + hi) / 2
		if 0.5*(1+math.Erf(m/math.Sqrt2)) < q {
			lo = m
		} else {
			hi = m
		}
	}
	return (lo + hi) / 2
}

// WriteScores prints the sides' rates with their 95 % Wilson intervals as
// a Markdown table.
func WriteScores(w io.Writer, scores []SideScore) {
	pc := func(k, n int, ci [2]float64) string {
		if n == 0 {
			return "–"
		}
		return fmt.Sprintf("%d/%d = %.0f %% (%.0f–%.0f)", k, n, 100*float64(k)/float64(n), 100*ci[0], 100*ci[1])
	}
	fmt.Fprintln(w, "| side | couplets | would hang | acceptable | odd | 横批 fits |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, s := range scores {
		if s.N == 0 {
			continue // a standard side the key does not use
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s |\n", s.Source, s.N, pc(s.Hang, s.N, s.HangCI),
			pc(s.Acceptable, s.N, s.AcceptCI), pc(s.Odd, s.N, s.OddCI), pc(s.BannerFits, s.BannerRows, s.BannerCI))
	}
	fmt.Fprintln(w, "\nRates with 95 % Wilson score intervals in brackets; 横批 fits counts the rows whose 横批 was shown.")
}

// UsedWords are the words that the recorded readings under dir (a folder,
// or one file such as the written training triples) name:
// every run of two or four Chinese characters in any of its files (the
// word columns, the sections' word lists in comments, the README), so that
// a held-out reading can avoid them. Longer runs (couplet lines) and the
// four-character 横批 count too, harmlessly: fresh words have two.
func UsedWords(dir string) (map[string]bool, error) {
	used := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		run := []rune{}
		flush := func() {
			if len(run) == 2 || len(run) == 4 {
				used[string(run)] = true
			}
			run = run[:0]
		}
		for _, r := range string(b) {
			if couplet.IsHan(r) {
				run = append(run, r)
			} else {
				flush()
			}
		}
		flush()
		return nil
	})
	return used, err
}

// WordCount is a candidate word for a held-out reading and the number of
// human couplets that hold it.
type WordCount struct {
	Word  string
	Human int
}

// FreshWords returns up to n two-character words for a held-out reading,
// the commonest first: words that at least minHuman human couplets of
// pool with lines of length characters hold (so the sheet can pair them
// with people's couplets), that used does not name, and that ok accepts
// (the caller's test: a dictionary word, festive, nothing unsuitable).
func FreshWords(pool []Couplet, length, n, minHuman int, used map[string]bool, ok func(string) bool) []WordCount {
	count := map[string]int{}
	for _, c := range pool {
		if length > 0 && len([]rune(c.Upper)) != length {
			continue
		}
		seen := map[string]bool{}
		for _, line := range []string{c.Upper, c.Lower} {
			r := []rune(line)
			for i := 0; i+1 < len(r); i++ {
				if w := string(r[i : i+2]); couplet.IsHan(r[i]) && couplet.IsHan(r[i+1]) && !seen[w] {
					seen[w] = true
					count[w]++
				}
			}
		}
	}
	var out []WordCount
	for w, k := range count {
		if k >= minHuman && !used[w] {
			out = append(out, WordCount{w, k})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Human != out[j].Human {
			return out[i].Human > out[j].Human
		}
		return out[i].Word < out[j].Word
	})
	var kept []WordCount
	for _, wc := range out {
		if len(kept) == n {
			break
		}
		if ok == nil || ok(wc.Word) {
			kept = append(kept, wc)
		}
	}
	return kept
}
