package quality

// signals.go: automatic signals of what a reader objects to, computed the
// same way for chunlian's couplets and for human ones of the same words.

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"chunlian/critic"
)

// Signals are one side's automatic signals. Shares are in [0, 1]; a
// signal that could not be computed is negative (Copied without training
// pairs, banner signals without a 横批).
type Signals struct {
	Source string
	N      int // couplets
	// Parallelism is the mean critic.Parallelism of the two lines.
	Parallelism float64
	// Unsuitable is the share of couplets with a critic.Unsuitable word
	// in a line or the 横批.
	Unsuitable float64
	// UnsuitableAdded is Unsuitable with the couplet's blessing word
	// (Couplet.Word) left out wherever it occurs: what the writer added,
	// not what the visitor typed (秋高气爽 holds 秋, which every couplet for
	// it, ours or people's, must hold too).
	UnsuitableAdded float64
	// Banners counts the couplets with a 横批; the next three are over them.
	Banners int
	// BannerReal is the share of 横批 that isRealBanner accepts (−1 when
	// no such function was given).
	BannerReal float64
	// BannerUnsuitable is the share of critic.UnsuitableBanner 横批.
	BannerUnsuitable float64
	// BannerOverlap is the mean share of a 横批's characters that occur in
	// its couplet's lines.
	BannerOverlap float64
	// Distinct2 is, per blessing word, the distinct character bigrams
	// (within lines) over all bigrams of that word's couplets, averaged
	// over words; Distinct2Per is the mean number of couplets per word it
	// saw (distinct-n falls as couplets are added: compare equal counts).
	Distinct2    float64
	Distinct2Per float64
	// Copied is the share of couplets whose (上联, 下联) is a training pair
	// (−1 when no training pairs were given).
	Copied float64
	// Festive is the mean critic.Festive of the two lines.
	Festive float64
}

// ComputeSignals computes cs's signals. isRealBanner may be nil (then
// BannerReal is −1); train holds training pairs as upper+"\t"+lower and
// may be nil (then Copied is −1).
func ComputeSignals(source string, cs []Couplet, isRealBanner func(string) bool, train map[string]bool) Signals {
	s := Signals{Source: source, N: len(cs), BannerReal: -1, Copied: -1}
	if len(cs) == 0 {
		return s
	}
	var real, bunsuit, copied int
	var par, fest, overlap float64
	byWord := map[string][]Couplet{}
	var words []string
	for _, c := range cs {
		par += critic.Parallelism(c.Upper, c.Lower)
		fest += critic.Festive(c.Upper + "\t" + c.Lower)
		text := c.Upper + "\t" + c.Lower + "\t" + c.Banner
		if len(critic.Unsuitable(text)) > 0 {
			s.Unsuitable++
			if len(critic.Unsuitable(withoutWord(text, c.Word))) > 0 {
				s.UnsuitableAdded++
			}
		}
		if train != nil && train[c.Upper+"\t"+c.Lower] {
			copied++
		}
		if c.Banner != "" {
			s.Banners++
			if isRealBanner != nil && isRealBanner(c.Banner) {
				real++
			}
			if critic.UnsuitableBanner(c.Banner) {
				bunsuit++
			}
			overlap += Overlap(c.Banner, c.Upper+c.Lower)
		}
		if _, ok := byWord[c.Word]; !ok {
			words = append(words, c.Word)
		}
		byWord[c.Word] = append(byWord[c.Word], c)
	}
	n := float64(len(cs))
	s.Parallelism, s.Festive, s.Unsuitable, s.UnsuitableAdded = par/n, fest/n, s.Unsuitable/n, s.UnsuitableAdded/n
	if train != nil {
		s.Copied = float64(copied) / n
	}
	if s.Banners > 0 {
		b := float64(s.Banners)
		s.BannerUnsuitable, s.BannerOverlap = float64(bunsuit)/b, overlap/b
		if isRealBanner != nil {
			s.BannerReal = float64(real) / b
		}
	} else {
		s.BannerUnsuitable, s.BannerOverlap = -1, -1
	}
	for _, w := range words {
		var lines []string
		for _, c := range byWord[w] {
			lines = append(lines, c.Upper, c.Lower)
		}
		s.Distinct2 += Distinct2(lines)
	}
	s.Distinct2 /= float64(len(words))
	s.Distinct2Per = n / float64(len(words))
	return s
}

// withoutWord blanks every occurrence of word in text with ideographic
// spaces, one per character, so that no list entry can match across or
// inside it.
func withoutWord(text, word string) string {
	if word == "" {
		return text
	}
	return strings.ReplaceAll(text, word, strings.Repeat("\u3000", utf8.RuneCountInString(word)))
}

// Distinct2 is the number of distinct character bigrams over the number
// of bigrams, bigrams taken within each line (0 when there is none).
func Distinct2(lines []string) float64 {
	seen := map[string]bool{}
	total := 0
	for _, l := range lines {
		r := []rune(l)
		for i := 0; i+1 < len(r); i++ {
			seen[string(r[i:i+2])] = true
			total++
		}
	}
	if total == 0 {
		return 0
	}
	return float64(len(seen)) / float64(total)
}

// Overlap is the share of banner's characters that occur in text.
func Overlap(banner, text string) float64 {
	r := []rune(banner)
	if len(r) == 0 {
		return 0
	}
	k := 0
	for _, c := range r {
		if strings.ContainsRune(text, c) {
			k++
		}
	}
	return float64(k) / float64(len(r))
}

// WriteSignals prints the sides' signals side by side as a Markdown table.
func WriteSignals(w io.Writer, sides []Signals) {
	row := func(name string, f func(Signals) string) {
		fmt.Fprintf(w, "| %s |", name)
		for _, s := range sides {
			fmt.Fprintf(w, " %s |", f(s))
		}
		fmt.Fprintln(w)
	}
	pct := func(x float64) string {
		if x < 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f %%", 100*x)
	}
	fmt.Fprint(w, "| signal |")
	for _, s := range sides {
		fmt.Fprintf(w, " %s |", s.Source)
	}
	fmt.Fprint(w, "\n|---|")
	for range sides {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	row("couplets", func(s Signals) string { return fmt.Sprint(s.N) })
	row("POS parallelism (mean)", func(s Signals) string { return fmt.Sprintf("%.3f", s.Parallelism) })
	row("with an unsuitable word", func(s Signals) string { return pct(s.Unsuitable) })
	row("… not inside the blessing word", func(s Signals) string { return pct(s.UnsuitableAdded) })
	row("with a 横批", func(s Signals) string { return fmt.Sprint(s.Banners) })
	row("横批 a real phrase", func(s Signals) string { return pct(s.BannerReal) })
	row("横批 unsuitable", func(s Signals) string { return pct(s.BannerUnsuitable) })
	row("横批 characters in the couplet", func(s Signals) string { return pct(s.BannerOverlap) })
	row("distinct-2 per word", func(s Signals) string { return fmt.Sprintf("%.3f (%.0f per word)", s.Distinct2, s.Distinct2Per) })
	row("copied from training pairs", func(s Signals) string { return pct(s.Copied) })
	row("festive (mean log-odds)", func(s Signals) string { return fmt.Sprintf("%+.3f", s.Festive) })
}
