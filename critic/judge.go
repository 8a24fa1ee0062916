package critic

// Judge bundles the package's signals as one value, for callers that take
// them through an interface (couplet.WithJudge). It is read-only after
// construction, so safe for concurrent use.
type Judge struct {
	// Year is the Gregorian year of the Spring Festival the couplets are
	// for (FestivalYear); Unsuitable then also reports year animals that
	// do not fit it (WrongYear). 0: no year check.
	Year int
}

// Parallelism is the package function Parallelism.
func (Judge) Parallelism(upper, lower string) float64 { return Parallelism(upper, lower) }

// Unsuitable is the package function Unsuitable, plus WrongYear's claims
// when j.Year is set.
func (j Judge) Unsuitable(text string) []string {
	out := Unsuitable(text)
	if j.Year != 0 {
		out = append(out, WrongYear(text, j.Year)...)
	}
	return out
}

// Taboo is the package function Taboo.
func (Judge) Taboo(text string) []string { return Taboo(text) }

// Festive is the package function Festive.
func (Judge) Festive(text string) float64 { return Festive(text) }

// OpensWord is the package function OpensWord.
func (Judge) OpensWord(line string) bool { return OpensWord(line) }
