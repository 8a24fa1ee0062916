package couplet

import (
	"context"
	"math"
	"slices"
	"sync"

	"chunlian/engine"
	"chunlian/sampler"
)

// Judge scores a finished couplet as a reader would object to it. The
// couplet package does not implement one; cmd wires a critic in
// (WithJudge). Implementations must be safe for concurrent use.
type Judge interface {
	// Parallelism is the part-of-speech and word-boundary alignment of the
	// two lines, in [0, 1].
	Parallelism(upper, lower string) float64
	// Unsuitable lists the words of text that do not belong on a 春联.
	Unsuitable(text string) []string
	// Taboo lists the ill-omened words of text (death, illness, grief …)
	// that no 春联 may hold at all: the blessing-word modes refuse a word
	// holding one.
	Taboo(text string) []string
	// Festive is how much text reads as a Spring Festival couplet (a
	// log-odds per character; 0 = neutral).
	Festive(text string) float64
	// OpensWord reports whether line's first character opens a word of
	// two or more characters as a reader segments the line.
	OpensWord(line string) bool
}

// Features are the signals one candidate couplet is ranked by.
type Features struct {
	LogProb  float64 `json:"logprob"`  // mean raw log-prob of the generated line tokens
	Tone     float64 `json:"tone"`     // 平仄 alternation and opposition, [0, 1]
	POS      float64 `json:"pos"`      // Judge.Parallelism, [0, 1]
	Festive  float64 `json:"festive"`  // Judge.Festive of 上联+下联
	Reverse  float64 `json:"reverse"`  // mean log P(上联 | 下联) by the lower-mode prompt
	Bad      int     `json:"bad"`      // Judge.Unsuitable words in 上联+下联
	Repeated int     `json:"repeated"` // repetitions a reader takes for slips (repeats): all but adjacent mirrored ones
	Heads    int     `json:"heads"`    // acrostic mode: lines whose head opens no word (Judge.OpensWord)
	Unpaired int     `json:"unpaired"` // four-character phrase mode: 1 when the 下联 opens with no phrase of the 横批 list
}

// Weights combine Features into a candidate's score (see Weights.Score).
type Weights struct {
	LogProb, Tone, POS, Festive, Reverse, Bad, Repeated, Heads, Unpaired float64
}

// DefaultSamples is how many constrained samples Generate draws and ranks
// per returned couplet unless WithOversample says otherwise: the readers'
// odd share of the top-ranked couplet stops falling past it
// (docs/DECISIONS.md, "Samples per couplet").
const DefaultSamples = 8

// DefaultWeights is the ranking the service ships: the weights fitted to
// blind readers' verdicts on ranked candidates (docs/DECISIONS.md,
// "Candidate ranking weights"), except Bad, which is a rule rather than a
// fit: a couplet with an unsuitable word ranks below every clean one.
// Tone and Reverse carried no signal the fit could use and stay 0 (Tone
// still breaks no rule: the constraints enforce 平仄 at the line ends).
// Heads is a prior, not a fit: readers mark an acrostic couplet odd about
// twice as often when a head opens no word (业羊, 丽回), so a candidate
// whose heads open words wins unless another is clearly likelier
// (docs/DECISIONS.md, "Acrostic heads that open a word"). Unpaired is a
// prior of the same kind: a 下联 that answers a four-character keyword
// (万事如意…) with no real phrase of its own (五讲五光, 鼓乐鼓锣) reads odd
// about four times as often (docs/DECISIONS.md, "A phrase answers a
// phrase").
var DefaultWeights = Weights{LogProb: 1, POS: 0.1, Festive: 0.1, Bad: 3, Repeated: 0.45, Heads: 0.3, Unpaired: 0.3}

// Score is the weighted sum: higher is better; Bad, Repeated, Heads and
// Unpaired count against a candidate.
func (w Weights) Score(f Features) float64 {
	return w.LogProb*f.LogProb + w.Tone*f.Tone + w.POS*f.POS + w.Festive*f.Festive +
		w.Reverse*f.Reverse - w.Bad*float64(f.Bad) - w.Repeated*float64(f.Repeated) - w.Heads*float64(f.Heads) -
		w.Unpaired*float64(f.Unpaired)
}

// Scored is one ranked candidate as Trace.Candidates reports it.
type Scored struct {
	Upper, Lower string
	Features     Features
	Score        float64
	Chosen       bool
}

// WithJudge sets the reader-side signals used in ranking and 横批 choice.
func WithJudge(j Judge) Option { return func(o *options) { o.judge = j } }

// DefaultSelectionTemperature is the Gumbel noise added to each score
// before the best candidate is picked: the pick is a draw with probability
// ∝ exp(score/τ) instead of the argmax, so that repeated requests for one
// word do not keep returning its few likeliest couplets (docs/DECISIONS.md,
// "Selection temperature"). Seeded by the request's seed; greedy requests
// (top-k 1) take the argmax.
const DefaultSelectionTemperature = 0.1

// DefaultRecentWindow is how many of a blessing word's last served
// couplets an unseeded request passes over when another candidate ranks
// close (recentMargin): trained on written couplets, the spring model
// gives a common word's likeliest couplet in up to half of the draws,
// which the selection temperature alone no longer spreads
// (docs/DECISIONS.md, "Served-recently window").
const DefaultRecentWindow = 8

// recentMargin is how far below the best candidate's score (mean log-prob
// units) a fresh candidate may rank and still be served instead of a
// recently served one.
const recentMargin = 0.25

// recentWords bounds the blessing words remembered; the oldest first
// seen is forgotten first.
const recentWords = 4096

// WithRecentWindow replaces DefaultRecentWindow (0 = serve repeats as
// ranked).
func WithRecentWindow(n int) Option { return func(o *options) { o.recentWindow = max(n, 0) } }

// recentServed remembers, per blessing word (mode, text and length), the
// last window couplets served to unseeded requests. Safe for concurrent
// use.
type recentServed struct {
	mu     sync.Mutex
	window int
	limit  int
	served map[string][]string // key -> "upper|lower", oldest first, at most window
	order  []string            // keys, oldest first seen first
}

func newRecentServed(window, limit int) *recentServed {
	return &recentServed{window: window, limit: limit, served: map[string][]string{}}
}

// demote moves the candidates served recently for key below every other
// (their selection key drops by recentDemotion), but only when a candidate
// not served recently scores within recentMargin of the best one: a
// repeat is better than a much worse couplet.
func (r *recentServed) demote(key string, cands []*candidate) {
	r.mu.Lock()
	seen := make(map[string]bool, r.window)
	for _, s := range r.served[key] {
		seen[s] = true
	}
	r.mu.Unlock()
	if len(seen) == 0 {
		return
	}
	best := math.Inf(-1)
	for _, cd := range cands {
		best = max(best, cd.c.Score)
	}
	var repeats []*candidate
	fresh := false
	for _, cd := range cands {
		if seen[linesKey(cd.c)] {
			repeats = append(repeats, cd)
		} else if cd.c.Score >= best-recentMargin {
			fresh = true
		}
	}
	if fresh {
		for _, cd := range repeats {
			cd.key -= recentDemotion
		}
	}
}

// linesKey identifies a couplet by its two lines (the 横批 aside).
func linesKey(c Couplet) string { return c.Upper + "|" + c.Lower }

// recentDemotion exceeds any spread of selection keys.
const recentDemotion = 1e6

// add records the couplets served for key.
func (r *recentServed) add(key string, out []Couplet) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list, ok := r.served[key]
	if !ok {
		r.order = append(r.order, key)
		for len(r.order) > r.limit {
			delete(r.served, r.order[0])
			r.order = r.order[1:]
		}
	}
	for _, c := range out {
		list = append(list, linesKey(c))
	}
	if len(list) > r.window {
		list = append([]string(nil), list[len(list)-r.window:]...)
	}
	r.served[key] = list
}

// WithSelectionTemperature replaces DefaultSelectionTemperature (0 = the
// argmax).
func WithSelectionTemperature(t float64) Option {
	return func(o *options) { o.selectTemp = max(t, 0) }
}

// WithWeights replaces DefaultWeights.
func WithWeights(w Weights) Option { return func(o *options) { o.weights = w } }

// features fills every signal of cd except Reverse.
func (g *Generator) features(p *plan, cd *candidate) Features {
	f := TextFeatures(cd.c.Upper, cd.c.Lower, cd.lineLP, g.o.judge)
	f.Tone = parallelism(g.t, p, cd.upperIDs, cd.lowerIDs)
	if p.mode == ModeAcrostic {
		f.Heads = headsOpenNoWord(cd.c.Upper, cd.c.Lower, g.o.judge)
	}
	if p.phrase && !g.opensWithPhrase(cd.c.Lower) {
		f.Unpaired = 1
	}
	return f
}

// opensWithPhrase reports whether line's first four characters are a
// phrase of the 横批 list (banners.txt and WithBanners' extras).
func (g *Generator) opensWithPhrase(line string) bool {
	n := 0
	for i := range line {
		if n == 4 {
			return g.phrases[line[:i]]
		}
		n++
	}
	return n == 4 && g.phrases[line]
}

// headsOpenNoWord counts the lines of an acrostic couplet whose head (its
// first character) opens no word by j (nil = none counted).
func headsOpenNoWord(upper, lower string, j Judge) int {
	n := 0
	if j != nil {
		for _, l := range [2]string{upper, lower} {
			if !j.OpensWord(l) {
				n++
			}
		}
	}
	return n
}

// TextFeatures are the Features that follow from a couplet's text and its
// mean log-prob alone: Repeated and, with a judge (nil = none), POS,
// Festive and Bad. Tone and Reverse need the model's tables and stay 0.
// Ranking recorded readings (quality's tests) goes through it, so the
// service and the measurement compute the signals one way.
func TextFeatures(upper, lower string, logProb float64, j Judge) Features {
	f := Features{LogProb: logProb, Repeated: repeats(upper, lower)}
	if j != nil {
		f.POS = j.Parallelism(upper, lower)
		f.Festive = j.Festive(upper + lower)
		f.Bad = len(j.Unsuitable(upper)) + len(j.Unsuitable(lower))
	}
	return f
}

// repeats counts the repetitions a reader takes for slips: a character
// repeated within a line where the other line does not repeat at the same
// positions (耕耘蜜果陶甜蜜), a third occurrence even when mirrored
// (福寿寿寿寿), a mirrored repeat that is not adjacent (喜气盈门增喜气 /
// 春风拂面暖春风: once per line), and a 下联 character that stands
// elsewhere in the 上联 (国泰民安… / 民安…). Adjacent mirrored pairs (叠字
// 年年 / 岁岁) are a figure, not a slip, and count nothing.
// docs/DECISIONS.md, "Candidate ranking weights", has the readings.
func repeats(upper, lower string) int {
	u, l := []rune(upper), []rune(lower)
	if len(u) != len(l) {
		return 0
	}
	n := 0
	for _, pair := range [2][2][]rune{{u, l}, {l, u}} {
		a, b := pair[0], pair[1]
		for i := range a {
			if !IsHan(a[i]) {
				continue
			}
			seen := 0
			for k := 0; k < i; k++ {
				if a[k] == a[i] {
					seen++
					if b[k] != b[i] || k < i-1 {
						n++ // unmirrored, or a mirrored echo
						break
					}
				}
			}
			if seen >= 2 {
				n++
			}
		}
	}
	for i, r := range l {
		if !IsHan(r) {
			continue
		}
		for j, x := range u {
			if x == r && j != i {
				n++
				break
			}
		}
	}
	return n
}

// reverseScores sets f[i].Reverse to the mean log P(上联 | 下联) of
// candidate i: one lower-mode request per candidate, forced through the
// 上联, all in flight together so the engine batches them. Lower mode has
// no 上联 to score, so it does nothing there.
func (g *Generator) reverseScores(ctx context.Context, p *plan, cands []*candidate, f []Features) error {
	if p.mode == ModeLower {
		return nil
	}
	sp := g.t.sp
	lt, _ := sp.LengthToken(p.lineLen)
	errs := make([]error, len(cands)) // slot i written by goroutine i only
	var wg sync.WaitGroup
	for i, cd := range cands {
		prompt := append([]int32{sp.BOS, sp.Lower, lt, sp.Up}, cd.lowerIDs...)
		prompt = append(prompt, sp.Sep)
		want := slices.Clone(cd.upperIDs)
		req := &engine.Request{
			Prompt: prompt,
			Params: sampler.Params{
				Temperature: 1, TopP: 1, MaxTokens: len(want), N: 1, Seed: 1,
			},
			NewProcessor: func(int) sampler.LogitsProcessor { return forcedSeq(want) },
			FollowUp:     true,
			Final:        true, // a score: nothing continues it
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := g.e.Generate(ctx, req)
			if err != nil {
				errs[i] = err
				return
			}
			if len(res.Completions) == 1 && len(res.Completions[0].LogProbs) == len(want) {
				f[i].Reverse = meanLP(res.Completions[0].LogProbs)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// forcedSeq forces the tokens of a fixed sequence in order (a dead end
// after it); the engine still reports each token's raw log-prob.
type forcedSeq []int32

func (s forcedSeq) next(gen []int32) int32 {
	if len(gen) < len(s) {
		return s[len(gen)]
	}
	return -1
}

// Process implements sampler.LogitsProcessor.
func (s forcedSeq) Process(gen []int32, logits []float32) error {
	return sampler.Force(logits, s.next(gen))
}

// Forced implements sampler.Forcer.
func (s forcedSeq) Forced(gen []int32, _ []float32) (int32, bool) { return s.next(gen), true }

// Mask implements sampler.Masker.
func (s forcedSeq) Mask(gen []int32, m *sampler.Mask) bool {
	m.Reset()
	m.Forced, m.Force = true, s.next(gen)
	return true
}

// singleWords maps a character to the two-character word a one-character
// keyword (福) is written with: the half (first or last two characters) of
// the 横批 list's phrases that contains it most often, the earlier phrase
// winning ties (lists put the commonest first): 福 → 五福 when 五福临门 and
// 五福… lead. Halves with a repeated character are skipped, and with a
// judge a half it reads as one word wins over one it does not: 美 → 美满,
// not 十美 (of 十全十美), which readers take for no word at all.
func singleWords(banners []bannerCand, j Judge) map[rune]string {
	type entry struct {
		word  string
		word1 bool // j reads it as one word (true without a judge)
		count int
		first int
	}
	best := map[rune]map[string]*entry{}
	for i, b := range banners {
		for _, h := range [][2]rune{{b.runes[0], b.runes[1]}, {b.runes[2], b.runes[3]}} {
			if h[0] == h[1] {
				continue
			}
			w := string(h[:])
			for _, r := range h {
				m := best[r]
				if m == nil {
					m = map[string]*entry{}
					best[r] = m
				}
				if e := m[w]; e != nil {
					e.count++
				} else {
					m[w] = &entry{w, j == nil || j.OpensWord(w), 1, i}
				}
			}
		}
	}
	out := make(map[rune]string, len(best))
	for r, m := range best {
		var top *entry
		for _, e := range m {
			if top == nil || e.word1 && !top.word1 || e.word1 == top.word1 &&
				(e.count > top.count || e.count == top.count && e.first < top.first) {
				top = e
			}
		}
		out[r] = top.word
	}
	return out
}
