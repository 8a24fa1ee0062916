package couplet

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"slices"
	"sort"
	"strings"

	"chunlian/engine"
	"chunlian/model"
	"chunlian/sampler"
)

// Generator writes couplets with a model on an engine. It is safe for
// concurrent use: its tables and banner lists are read-only after New, and
// each Generate call owns its own state.
type Generator struct {
	t       *tables
	e       engine.Engine
	banners []bannerCand
	phrases map[string]bool // the banners' texts (extras' dedup, Features.Unpaired)
	sources []string        // banner lists actually read
	o       options
	// inflight counts the Generate calls under way (WithIdleSamples).
	inflight atomic.Int64
	// recent holds each blessing word's last served couplets
	// (WithRecentWindow); nil when the window is 0.
	recent *recentServed
}

type options struct {
	maxAttempts  int
	oversample   int
	idleSamples  int  // WithIdleSamples: samples while idle (0 = off)
	idleBelow    int  // … while at most this many calls are under way
	finishers    int  // WithFinishers: samples per couplet that write a 下联 (0 = all)
	noKeep       bool // WithKeptSamples(false)
	bannerTopK   int
	bannerPool   int
	bannerSrcs   []BannerSource
	extraBanners []string
	judge        Judge
	weights      Weights
	selectTemp   float64
	recentWindow int           // WithRecentWindow
	temperature  float32       // of requests that leave Temperature unset
	style        engine.Engine // keyword and acrostic requests (nil = New's engine)
}

// Option configures a Generator.
type Option func(*options)

// WithBannerSources replaces the default retrieval lists (see
// DefaultBannerSources). Missing files are skipped.
func WithBannerSources(s ...BannerSource) Option {
	return func(o *options) { o.bannerSrcs = s }
}

// WithBanners adds retrieval candidates directly (real 横批 prior).
func WithBanners(list ...string) Option {
	return func(o *options) { o.extraBanners = append(o.extraBanners, list...) }
}

// WithTemperature sets the sampling temperature of requests that leave
// Temperature unset (0); t ≤ 0 keeps DefaultTemperature.
func WithTemperature(t float32) Option {
	return func(o *options) {
		if t > 0 {
			o.temperature = t
		}
	}
}

// WithStyleEngine runs the blessing-word modes (keyword and acrostic) on
// e, and lower mode on New's engine: e serves a model tuned to write
// spring-festival couplets, New's engine the model whose lower mode the
// evaluation's floors measure. e's model must share New's tokenizer and
// prompt contract (model.Compatible).
func WithStyleEngine(e engine.Engine) Option { return func(o *options) { o.style = e } }

// WithMaxAttempts bounds the resampling rounds when samples dead-end
// (default 4).
func WithMaxAttempts(n int) Option { return func(o *options) { o.maxAttempts = n } }

// WithOversample sets how many samples are drawn per requested candidate in
// constrained mode, for ranking and diversity (default DefaultSamples;
// total capped at 32).
func WithOversample(k int) Option { return func(o *options) { o.oversample = k } }

// WithFinishers lets only k of the samples drawn per requested couplet
// write a 下联: the samples' 上联s are drawn first, ranked by the 上联's
// own signals (upperScore), and the best k go on. A 上联 costs about half
// a sample's rows, so k = 3 of 5 computes about a quarter fewer rows per
// couplet. k = 0 or k ≥ the samples drawn: every sample writes its 下联
// (one engine request, as without the option). Streamed requests and
// lower mode (the 上联 is given) always draw every sample whole, and so
// does every request while WithIdleSamples counts the generator as idle
// (at most its bound of calls under way).
func WithFinishers(k int) Option { return func(o *options) { o.finishers = max(k, 0) } }

// WithKeptSamples(false) continues a couplet's requests through the
// prefix cache even when the engine keeps samples (engine.Keeper); on by
// default. Several engine loops on one GPU serve more without: a kept
// sample binds its continuation to the loop that holds it
// (docs/DECISIONS.md, "Kept samples continued by handle").
func WithKeptSamples(on bool) Option { return func(o *options) { o.noKeep = !on } }

// DefaultIdleBelow is the in-flight bound of WithIdleSamples front ends
// use: a handful of users, far below where the extra rows would cost a
// GPU throughput.
const DefaultIdleBelow = 16

// WithIdleSamples draws k samples per candidate instead of the oversample
// while at most below Generate calls (this one included) are under way,
// for requests without a seed (a seeded request stays reproducible
// whatever the load). More samples read better; an idle device computes
// them at nearly the cost of fewer (docs/DECISIONS.md, "Samples per
// couplet"). k ≤ the oversample turns it off.
func WithIdleSamples(k, below int) Option {
	return func(o *options) { o.idleSamples, o.idleBelow = k, below }
}

// WithBannerTopK sets how many retrieved 横批 are scored per couplet besides
// the model's own (default DefaultBannerTopK; 0 = model banner only). They
// are the k of the lexical prefilter's pool (WithBannerPool) whose first
// character the model finds likeliest after the couplet.
func WithBannerTopK(k int) Option { return func(o *options) { o.bannerTopK = k } }

// WithBannerPool sets how many retrieval candidates the lexical prefilter
// passes on per couplet (default 32, never fewer than the banner top-k).
// Choosing the scored ones among them costs no forward pass: it reads the
// one logits row at <ban> that every 横批 sample starts from.
func WithBannerPool(n int) Option { return func(o *options) { o.bannerPool = n } }

// DefaultBannerSources is the 横批 list New reads unless WithBannerSources
// is given: banners.txt, embedded (real, auspicious phrases only: a 横批
// is never made up). Candidates are filtered by the model's vocabulary,
// so the list suits any model.
func DefaultBannerSources() []BannerSource {
	return []BannerSource{{FS: bannerFS, Path: "banners.txt", Prior: 1}}
}

//go:embed banners.txt
var bannerFS embed.FS

// BannerList returns the phrases of the embedded 横批 list, in list order.
func BannerList() []string {
	b, err := bannerFS.ReadFile("banners.txt")
	if err != nil {
		panic("couplet: embedded banners.txt: " + err.Error()) // embedded at build time
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	return out
}

// New builds a Generator for model m on engine e.
func New(m *model.Model, e engine.Engine, opts ...Option) (*Generator, error) {
	if m == nil || m.Tok == nil {
		return nil, errors.New("couplet: nil model or tokenizer")
	}
	sp := Specials{
		BOS: m.Special("bos"), EOS: m.Special("eos"), Keyword: m.Special("keyword"),
		Acrostic: m.Special("acrostic"), Lower: m.Special("lower"), Up: m.Special("up"),
		Sep: m.Special("sep"), Banner: m.Special("banner"),
		LengthToken: m.LengthToken, MaxLine: m.Meta.MaxLineLength,
	}
	return NewWithVocab(m.Tok, sp, e, opts...)
}

// NewWithVocab builds a Generator from a tokenizer and its special ids
// (New does this from a *model.Model).
func NewWithVocab(v Vocab, sp Specials, e engine.Engine, opts ...Option) (*Generator, error) {
	if e == nil {
		return nil, errors.New("couplet: nil engine")
	}
	o := options{maxAttempts: 4, oversample: DefaultSamples, temperature: DefaultTemperature, weights: DefaultWeights, selectTemp: DefaultSelectionTemperature, recentWindow: DefaultRecentWindow, bannerTopK: DefaultBannerTopK, bannerPool: DefaultBannerPool, bannerSrcs: DefaultBannerSources()}
	for _, f := range opts {
		f(&o)
	}
	if o.maxAttempts < 1 {
		o.maxAttempts = 1
	}
	if o.oversample < 1 {
		o.oversample = 1
	}
	o.bannerTopK = max(o.bannerTopK, 0)
	o.bannerPool = max(o.bannerPool, o.bannerTopK)
	t, err := newTables(v, sp)
	if err != nil {
		return nil, err
	}
	g := &Generator{t: t, e: e, o: o}
	if o.recentWindow > 0 {
		g.recent = newRecentServed(o.recentWindow, recentWords)
	}
	g.banners, g.sources = t.loadBanners(o.bannerSrcs)
	g.phrases = make(map[string]bool, len(g.banners))
	for _, b := range g.banners {
		g.phrases[b.text] = true
	}
	if len(o.extraBanners) > 0 {
		before := len(g.banners) // parseBanners adds the new ones to g.phrases
		g.banners = t.parseBanners(strings.NewReader(strings.Join(o.extraBanners, "\n")), 1, g.phrases, g.banners)
		if len(g.banners) > before {
			g.sources = append(g.sources, "(inline)")
		}
	}
	t.singles, t.judge = singleWords(g.banners, o.judge), o.judge
	return g, nil
}

// engine is the engine that serves p's mode.
func (g *Generator) engine(p *plan) engine.Engine {
	if g.o.style != nil && p.mode != ModeLower {
		return g.o.style
	}
	return g.e
}

// BannerSources lists the retrieval lists that were read, and NumBanners
// the number of usable candidates, for logs.
func (g *Generator) BannerSources() []string { return append([]string(nil), g.sources...) }
func (g *Generator) NumBanners() int         { return len(g.banners) }

// MaxLength is the longest Length the model supports.
func (g *Generator) MaxLength() int { return g.t.maxChars }

// Validate checks a request without generating (for the HTTP layer).
func (g *Generator) Validate(req Request) error {
	_, err := g.t.prepare(req, g.o.temperature)
	return err
}

// prompt builds the model input of a plan (model.PromptTokens.Prompt, the
// one builder of the layouts).
func (g *Generator) prompt(p *plan) []int32 {
	sp := g.t.sp
	lt, _ := sp.LengthToken(p.lineLen)
	pt := model.PromptTokens{BOS: sp.BOS, EOS: sp.EOS, Keyword: sp.Keyword, Acrostic: sp.Acrostic,
		Lower: sp.Lower, Up: sp.Up, Sep: sp.Sep, Banner: sp.Banner}
	var heads []int32
	if p.mode != ModeLower {
		heads = p.heads[:]
	}
	out, _ := pt.Prompt(string(p.mode), heads, lt, p.upper) // modes are validated by prepare
	return out
}

// Defaults of the 横批 stage (see WithBannerTopK, WithBannerPool); why
// these values: docs/DECISIONS.md, "横批 candidates".
const (
	DefaultBannerTopK = 2
	DefaultBannerPool = 32
)

// candidate is one parsed sample.
type candidate struct {
	upperIDs, lowerIDs []int32 // [lineLen] each when well formed
	c                  Couplet
	lineLP             float64 // mean raw log-prob of the generated line tokens
	key                float64 // selection key: c.Score + Gumbel noise (selectDiverse)
	attempt, sample    int     // where it came from (streaming)
	// handle is the engine's kept cache of the sample (engine.Request.Keep),
	// which the 横批 request continues; 0 when not kept.
	handle engine.Handle
}

// keptSamples collects the handles of one Generate call's kept samples
// and gives back, when the call ends, every one not continued (a
// continued handle is spent, and releasing it does nothing).
type keptSamples struct {
	k  engine.Keeper // nil: the engine keeps nothing, and requests do not ask
	mu sync.Mutex    // the 上联 continuations run concurrently
	hs []engine.Handle
}

func (g *Generator) newKeptSamples(eng engine.Engine) *keptSamples {
	k, _ := eng.(engine.Keeper)
	if g.o.noKeep {
		k = nil
	}
	return &keptSamples{k: k}
}

// on reports whether requests should ask to keep their samples.
func (ks *keptSamples) on() bool { return ks.k != nil }

// add records res's handles.
func (ks *keptSamples) add(res *engine.Result) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	for _, c := range res.Completions {
		if c.Handle != 0 {
			ks.hs = append(ks.hs, c.Handle)
		}
	}
}

// release gives back every handle recorded and not dropped yet.
func (ks *keptSamples) release() {
	ks.mu.Lock()
	hs := ks.hs
	ks.hs = nil
	ks.mu.Unlock()
	ks.give(hs)
}

// drop gives back hs now (samples the ranking passed over), so that
// their blocks do not wait for the end of the call, and forgets them.
func (ks *keptSamples) drop(hs ...engine.Handle) {
	ks.mu.Lock()
	ks.hs = slices.DeleteFunc(ks.hs, func(h engine.Handle) bool { return slices.Contains(hs, h) })
	ks.mu.Unlock()
	ks.give(hs)
}

func (ks *keptSamples) give(hs []engine.Handle) {
	if ks.k != nil && len(hs) > 0 {
		ks.k.Release(hs...)
	}
}

// Generate writes req.N couplets (fewer only if the attempt budget runs out
// after at least one). Input problems are *InputError; ctx and engine
// errors are returned as they are; ErrNoCouplet if every sample of every
// attempt dead-ended.
//
// Constrained (default): N·oversample samples share the prompt; each runs
// the rule processor and stops at the end of the 下联; dead-ended samples
// are dropped and, while fewer than N distinct couplets exist, another round
// is drawn with a new seed (at most maxAttempts rounds). Survivors are
// re-checked with Check, ranked by length-normalised model log-prob plus a
// tone-parallelism bonus and picked greedily for diversity; then one 横批
// request per picked couplet writes the model's own 横批 and scores the
// best retrieved ones in the same batch (chooseBanners).
func (g *Generator) Generate(ctx context.Context, req Request) ([]Couplet, error) {
	p, err := g.t.prepare(req, g.o.temperature)
	if err != nil {
		return nil, err
	}
	oversample := g.o.oversample
	n := g.inflight.Add(1)
	defer g.inflight.Add(-1)
	// A device with idle samples configured (the GPU) has rows to spare at
	// low load: there every sample is finished, seeded or not, since a
	// second round of requests would only add latency.
	idle := g.o.idleSamples > oversample && n <= int64(g.o.idleBelow)
	if idle && p.seed == 0 {
		oversample = g.o.idleSamples
	}
	// Every sample is finished in one request while idle, in lower mode
	// (the 上联 is given), when tokens are streamed as drawn, and for
	// greedy requests.
	finishers := g.o.finishers
	if idle || p.mode == ModeLower || p.onToken != nil || p.topK == 1 {
		finishers = 0
	}
	// Only unseeded sampled requests avoid repeats: a seed promises the
	// same couplet again.
	var recentKey string
	if p.seed == 0 && p.topK != 1 && g.recent != nil && (p.mode == ModeKeyword || p.mode == ModeAcrostic) {
		recentKey = fmt.Sprintf("%s|%s|%d", p.mode, p.headText, p.lineLen)
	}
	if p.seed == 0 {
		p.seed = rand.Uint64() | 1
	}
	prompt := g.prompt(p)
	if p.unconstr {
		return g.generateRaw(ctx, p, prompt)
	}
	var cands []*candidate
	var feats []Features // [len(cands)] each candidate's ranking signals
	seen := map[string]bool{}
	// clean counts the candidates without an unsuitable word (Features.Bad
	// 0, as every one is without a judge). While fewer than N are clean,
	// up to cleanRounds more rounds are drawn (sampled requests only:
	// greedy ones repeat themselves): the ranking puts an unsuitable word
	// below every clean couplet, so one clean candidate is worth a round
	// of rows.
	clean := 0
	wantClean := func(attempt int) bool {
		return g.o.judge != nil && clean < p.n && attempt <= cleanRounds && p.topK != 1
	}
	eng := g.engine(p)
	ks := g.newKeptSamples(eng)
	defer ks.release()
	stage := startStage(req.Trace, eng, StageCandidates)
	for attempt := 0; attempt < g.o.maxAttempts && (len(cands) < p.n || wantClean(attempt)); attempt++ {
		m := (p.n - clean) * oversample
		if p.topK == 1 && p.mode != ModeKeyword {
			// Greedy samples of one prompt are identical (keyword mode
			// still differs by keyword placement): oversampling is waste.
			m = p.n - len(cands)
		}
		m = min(m, 32)
		keep := m
		if finishers > 0 && finishers < oversample {
			keep = max((p.n-clean)*finishers, 1)
		}
		comps, err := g.sampleLines(ctx, eng, ks, p, prompt, attempt, m, keep, stage)
		if err != nil {
			return nil, err
		}
		for _, comp := range comps {
			cd := g.parseConstrained(p, comp)
			if cd == nil {
				continue
			}
			cd.attempt, cd.sample, cd.handle = attempt, comp.Index, comp.Handle
			key := linesKey(cd.c)
			if seen[key] {
				continue
			}
			seen[key] = true
			cands = append(cands, cd)
			feats = append(feats, g.features(p, cd))
			if feats[len(feats)-1].Bad == 0 {
				clean++
			}
		}
	}
	stage.end()
	if len(cands) == 0 {
		return nil, ErrNoCouplet
	}
	stage = startStage(req.Trace, eng, StageRank)
	if g.o.weights.Reverse != 0 || (req.Trace != nil && req.Trace.Explain) {
		if err := g.reverseScores(ctx, p, cands, feats); err != nil {
			return nil, err
		}
	}
	noise := rand.New(rand.NewPCG(p.seed, 0x5E1EC7))
	tau := g.o.selectTemp
	if p.topK == 1 {
		tau = 0 // greedy decoding picks deterministically too
	}
	for i, cd := range cands {
		cd.c.Score = g.o.weights.Score(feats[i])
		cd.key = cd.c.Score + tau*gumbel(noise)
	}
	if recentKey != "" {
		g.recent.demote(recentKey, cands)
	}
	chosen := selectDiverse(cands, p.n)
	var passed []engine.Handle // only the chosen couplets' samples are continued (the 横批)
	for _, cd := range cands {
		if cd.handle != 0 && !slices.Contains(chosen, cd) {
			passed = append(passed, cd.handle)
		}
	}
	ks.drop(passed...)
	stage.end()
	if req.Trace != nil && req.Trace.Explain {
		req.Trace.Candidates = explain(cands, feats, chosen)
	}
	chosen, err = g.chooseBanners(ctx, p, prompt, chosen, req.Trace)
	if err != nil {
		return nil, err
	}
	if len(chosen) == 0 {
		return nil, ErrNoCouplet
	}
	sort.SliceStable(chosen, func(i, j int) bool { return chosen[i].c.Score > chosen[j].c.Score })
	out := make([]Couplet, len(chosen))
	for i, cd := range chosen {
		out[i] = cd.c
	}
	if recentKey != "" {
		g.recent.add(recentKey, out)
	}
	return out, nil
}

// sampleLines draws m constrained samples of one attempt and returns
// them as completions of the lines (上联, <sep>, 下联). With keep < m
// (Generate decides when; never in lower mode) it draws the m 上联s alone
// first, keeps the keep best by upperScore, and continues each from a prompt
// that ends in its 上联, taking over the sample's kept cache (ks; the
// prefix cache where the engine keeps none), so only the 上联's last token
// is computed again; the others are given back at once. A continued sample keeps its
// index's constraint (keyword placement) and a seed of its own, so seeded
// requests stay reproducible.
func (g *Generator) sampleLines(ctx context.Context, eng engine.Engine, ks *keptSamples, p *plan, prompt []int32, attempt, m, keep int, stage *stageTimer) ([]engine.Completion, error) {
	req := g.engineRequest(p, prompt, attempt, m, true)
	req.Keep = ks.on()         // continued by the 上联's finisher or the 横批 request
	req.FollowUp = attempt > 0 // the first round was let in
	L := p.lineLen
	if keep >= m {
		res, err := eng.Generate(ctx, req)
		if err != nil {
			return nil, err
		}
		ks.add(res)
		stage.addResult(res)
		return res.Completions, nil
	}
	linesMax := req.Params.MaxTokens
	req.Params.MaxTokens = L
	res, err := eng.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	ks.add(res)
	stage.addResult(res)
	type upper struct {
		comp  engine.Completion
		score float64
	}
	ups := make([]upper, 0, len(res.Completions))
	seen := make(map[string]bool, len(res.Completions))
	for _, c := range res.Completions {
		if c.Finish != engine.FinishLength || len(c.Tokens) != L || len(c.LogProbs) != L {
			continue // dead end: nothing to continue
		}
		text := g.t.text(c.Tokens)
		if seen[text] {
			continue
		}
		seen[text] = true
		ups = append(ups, upper{c, g.upperScore(text, c.LogProbs)})
	}
	slices.SortStableFunc(ups, func(a, b upper) int { return cmp.Compare(b.score, a.score) })
	ups = ups[:min(keep, len(ups))]
	var passed []engine.Handle // the 上联s not continued
	for _, c := range res.Completions {
		if c.Handle != 0 && !slices.ContainsFunc(ups, func(u upper) bool { return u.comp.Handle == c.Handle }) {
			passed = append(passed, c.Handle)
		}
	}
	ks.drop(passed...)
	out := make([]engine.Completion, len(ups))
	errs := make([]error, len(ups))
	var wg sync.WaitGroup
	for k, u := range ups {
		next := &engine.Request{
			Prompt:   append(slices.Clip(prompt), u.comp.Tokens...),
			Params:   req.Params,
			Keep:     ks.on(),
			From:     u.comp.Handle,
			FollowUp: true,
		}
		next.Params.N, next.Params.MaxTokens = 1, linesMax-L
		next.Params.Seed = seedFor(req.Params.Seed, 1+u.comp.Index)
		// buf is sized for the prefix and the finisher's whole output
		// here, so the engine goroutine (which calls the processor)
		// does not grow it.
		proc := &continued{p: req.NewProcessor(u.comp.Index), prefix: u.comp.Tokens,
			buf: make([]int32, 0, len(u.comp.Tokens)+next.Params.MaxTokens+1)}
		next.NewProcessor = func(int) sampler.LogitsProcessor { return proc }
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := eng.Generate(ctx, next)
			if err != nil {
				errs[k] = err
				return
			}
			ks.add(r)
			stage.addResult(r)
			if len(r.Completions) == 0 {
				return // parseConstrained drops the empty completion
			}
			c := r.Completions[0]
			out[k] = engine.Completion{
				Index:    u.comp.Index,
				Tokens:   append(slices.Clip(u.comp.Tokens), c.Tokens...),
				LogProbs: append(slices.Clip(u.comp.LogProbs), c.LogProbs...),
				Finish:   c.Finish,
				Handle:   c.Handle,
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err // the first, as the one request's error would be
		}
	}
	return out, nil
}

// upperScore ranks a 上联 before its 下联 exists: the couplet's weights
// on the signals one line has (mean log-prob, festive, unsuitable words).
func (g *Generator) upperScore(text string, lp []float32) float64 {
	f := Features{LogProb: meanLP(lp)}
	if j := g.o.judge; j != nil {
		f.Festive = j.Festive(text)
		f.Bad = len(j.Unsuitable(text))
	}
	return g.o.weights.Score(f)
}

var (
	_ sampler.Forcer = (*continued)(nil)
	_ sampler.Masker = (*continued)(nil)
)

// continued is a sample's processor once its 上联 has moved into the
// prompt: the constraint sees the 上联 as generated. One per sequence (the
// engine never calls a sequence's processor concurrently with itself).
type continued struct {
	p      sampler.LogitsProcessor
	prefix []int32
	buf    []int32
}

func (k *continued) gen(g []int32) []int32 {
	k.buf = append(append(k.buf[:0], k.prefix...), g...)
	return k.buf
}

func (k *continued) Process(g []int32, l []float32) error { return k.p.Process(k.gen(g), l) }

func (k *continued) Forced(g []int32, l []float32) (int32, bool) {
	if f, ok := k.p.(sampler.Forcer); ok {
		return f.Forced(k.gen(g), l)
	}
	return 0, false
}

func (k *continued) Mask(g []int32, m *sampler.Mask) bool {
	if mk, ok := k.p.(sampler.Masker); ok {
		return mk.Mask(k.gen(g), m)
	}
	return false
}

// cleanRounds bounds the rounds drawn only because no candidate was
// clean of unsuitable words (docs/DECISIONS.md, "A round more when
// nothing is clean").
const cleanRounds = 1

// seedFor gives attempt a its own seed (golden-ratio stride).
func seedFor(seed uint64, attempt int) uint64 {
	s := seed + uint64(attempt)*0x9E3779B97F4A7C15
	if s == 0 {
		s = 1
	}
	return s
}

func (g *Generator) engineRequest(p *plan, prompt []int32, attempt, m int, constrained bool) *engine.Request {
	maxTok := 2*p.lineLen + 8 // upper sep lower ban b1..b4 eos, +1 slack
	if p.mode == ModeLower {
		maxTok = p.lineLen + 7
	}
	r := &engine.Request{
		Prompt: prompt,
		Params: sampler.Params{
			Temperature: p.temp, TopP: p.topP, TopK: p.topK,
			MaxTokens: maxTok, StopTokens: []int32{g.t.sp.EOS},
			Seed: seedFor(p.seed, attempt), N: m,
		},
	}
	if constrained {
		free, head := newConstraint(g.t, p), newConstraint(g.t, p, true)
		// The lines only: the 横批 is written by chooseBanners' request,
		// together with the retrieved candidates it competes with.
		r.Params.MaxTokens = free.linesLen()
		// Constraints keep no mutable state, so two serve all samples:
		// even samples let the model place the keyword, odd ones put it
		// first (keyword mode; elsewhere both are the same).
		r.NewProcessor = func(i int) sampler.LogitsProcessor {
			if i%2 == 1 {
				return head
			}
			return free
		}
	}
	if p.onToken != nil {
		r.OnEvent = g.streamer(p, attempt, m)
	}
	return r
}

// streamer turns engine events into TokenEvents. The engine calls OnEvent on
// its own goroutine, one event at a time, so count needs no lock.
func (g *Generator) streamer(p *plan, attempt, m int) func(engine.Event) {
	count := make([]int, m) // [m] tokens seen per sample
	L := p.lineLen
	return func(ev engine.Event) {
		if ev.Index < 0 || ev.Index >= m || (ev.Done && ev.Token < 0) {
			return
		}
		i := count[ev.Index]
		count[ev.Index]++
		if ev.Done && ev.Finish != engine.FinishStop {
			return
		}
		var part Part
		switch {
		case p.mode != ModeLower && i < L:
			part = PartUpper
		case p.mode != ModeLower && i > L && i <= 2*L:
			part = PartLower
		case p.mode == ModeLower && i < L:
			part = PartLower
		default:
			part = PartBanner
		}
		if ev.Token < 0 || int(ev.Token) >= len(g.t.char) || g.t.char[ev.Token] == 0 {
			return
		}
		p.onToken(TokenEvent{Attempt: attempt, Sample: ev.Index, Part: part, Text: string(g.t.char[ev.Token])})
	}
}

// parseConstrained turns a finished constrained sample (the lines, without
// the 横批) into a candidate, or nil if it dead-ended or (defensively)
// breaks a rule.
func (g *Generator) parseConstrained(p *plan, comp engine.Completion) *candidate {
	want := newConstraint(g.t, p).linesLen()
	if comp.Finish != engine.FinishLength || len(comp.Tokens) != want || len(comp.LogProbs) != want {
		return nil
	}
	L := p.lineLen
	cd := &candidate{}
	var lp []float32
	if p.mode == ModeLower {
		cd.upperIDs = p.upper
		cd.lowerIDs = comp.Tokens[:L]
		lp = comp.LogProbs[:L]
	} else {
		cd.upperIDs = comp.Tokens[:L]
		cd.lowerIDs = comp.Tokens[L+1 : 2*L+1]
		lp = comp.LogProbs[:2*L+1]
	}
	cd.c = Couplet{Upper: g.t.text(cd.upperIDs), Lower: g.t.text(cd.lowerIDs)}
	if !g.linesOK(p, cd.c) {
		return nil
	}
	if p.mode == ModeKeyword && !ContainsKeyword(cd.c, p.headText) {
		return nil
	}
	if p.mode == ModeAcrostic && (cd.upperIDs[0] != p.heads[0] || cd.lowerIDs[0] != p.heads[1]) {
		return nil
	}
	cd.lineLP = meanLP(lp)
	return cd
}

// linesOK re-checks the lines of a constrained candidate against rules 1–3
// (defensive: the processor already enforces them). The 横批 is checked
// when it is chosen. In lower mode the 上联 is the user's: its tone is not
// ours to enforce.
func (g *Generator) linesOK(p *plan, c Couplet) bool {
	rep := Check(c.Upper, c.Lower, "")
	return rep.Rule1() && rep.LowerPing && rep.Rule3() && (p.mode == ModeLower || rep.UpperZe)
}

func meanLP(lp []float32) float64 {
	if len(lp) == 0 {
		return 0
	}
	s := 0.0
	for _, v := range lp {
		s += float64(v)
	}
	return s / float64(len(lp))
}

// generateRaw is the unconstrained path: N plain samples, parsed as they
// come (possibly malformed), the model's own banner, no ranking.
func (g *Generator) generateRaw(ctx context.Context, p *plan, prompt []int32) ([]Couplet, error) {
	res, err := g.engine(p).Generate(ctx, g.engineRequest(p, prompt, 0, p.n, false))
	if err != nil {
		return nil, err
	}
	sp := g.t.sp
	out := make([]Couplet, 0, len(res.Completions))
	for _, comp := range res.Completions {
		toks := comp.Tokens
		var segs [][]int32 // split at <sep> / <ban>, stop at <eos>
		cur := []int32{}
		for _, id := range toks {
			if id == sp.EOS {
				break
			}
			if id == sp.Sep || id == sp.Banner {
				segs = append(segs, cur)
				cur = []int32{}
				continue
			}
			cur = append(cur, id)
		}
		segs = append(segs, cur)
		var c Couplet
		if p.mode == ModeLower {
			c.Upper = g.t.text(p.upper)
			c.Lower = g.rawText(segs[0])
			if len(segs) > 1 {
				c.Banner = g.rawText(segs[len(segs)-1])
			}
		} else {
			c.Upper = g.rawText(segs[0])
			if len(segs) > 1 {
				c.Lower = g.rawText(segs[1])
			}
			if len(segs) > 2 {
				c.Banner = g.rawText(segs[len(segs)-1])
			}
		}
		c.Score = meanLP(comp.LogProbs)
		out = append(out, c)
	}
	return out, nil
}

// rawText renders ids as the tokenizer spells them, specials included, so
// that Check sees malformed output for what it is.
func (g *Generator) rawText(ids []int32) string {
	s := ""
	for _, id := range ids {
		s += g.t.vocab.Token(id)
	}
	return s
}

// The couplet's score (Weights.Score) gains bannerWeight·(mean log-prob of
// the chosen banner's 4 characters); diversityCost is the MMR penalty per
// unit of similarity when several couplets are returned.
const (
	bannerWeight  = 0.2
	diversityCost = 1.0
)

// explain lists every candidate with its features, best score first.
func explain(cands []*candidate, feats []Features, chosen []*candidate) []Scored {
	out := make([]Scored, len(cands))
	for i, cd := range cands {
		out[i] = Scored{Upper: cd.c.Upper, Lower: cd.c.Lower, Features: feats[i], Score: cd.c.Score, Chosen: slices.Contains(chosen, cd)}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Score > out[j].Score })
	return out
}

// parallelism is a soft tone score in [0, 1]: at the rhythm-carrying
// positions of each clause (2nd, 4th, 6th character and the clause end) the
// two lines should have opposite 平仄, and inside the 上联 consecutive
// rhythm positions should alternate (二四六分明).
func parallelism(t *tables, p *plan, u, l []int32) float64 {
	hits, total := 0, 0
	start := 0
	for j := 0; j <= len(u); j++ {
		if j < len(u) && p.template[j] == -1 {
			continue
		}
		// clause is u[start:j]
		var prev Tone
		for k := start; k < j; k++ {
			off := k - start
			if off%2 == 0 && k != j-1 {
				continue
			}
			tu, tl := t.tone[u[k]], t.tone[l[k]]
			if tu != ToneUnknown && tl != ToneUnknown {
				total++
				if tu != tl {
					hits++
				}
			}
			if tu != ToneUnknown && prev != ToneUnknown && k != j-1 {
				total++
				if tu != prev {
					hits++
				}
			}
			prev = tu
		}
		start = j + 1
	}
	if total == 0 {
		return 0
	}
	return float64(hits) / float64(total)
}

// similarity is the fraction of positions where two candidates share the
// 上联 or the 下联 character.
func similarity(a, b *candidate) float64 {
	n, same := 0, 0
	for i := range a.upperIDs {
		if i < len(b.upperIDs) && a.upperIDs[i] == b.upperIDs[i] {
			same++
		}
		if i < len(b.lowerIDs) && i < len(a.lowerIDs) && a.lowerIDs[i] == b.lowerIDs[i] {
			same++
		}
		n += 2
	}
	if n == 0 {
		return 0
	}
	return float64(same) / float64(n)
}

// gumbel draws a standard Gumbel variate: argmax of score + τ·gumbel picks
// a candidate with probability ∝ exp(score/τ).
func gumbel(r *rand.Rand) float64 {
	return -math.Log(-math.Log(1 - r.Float64()))
}

// selectDiverse picks n candidates greedily by selection key minus diversityCost ×
// the highest similarity to one already picked (maximal marginal relevance).
func selectDiverse(c []*candidate, n int) []*candidate {
	left := append([]*candidate(nil), c...)
	var out []*candidate
	for len(out) < n && len(left) > 0 {
		bi, bv := 0, math.Inf(-1)
		for i, cd := range left {
			v := cd.key
			for _, o := range out {
				v = min(v, cd.key-diversityCost*similarity(cd, o))
			}
			if v > bv {
				bi, bv = i, v
			}
		}
		out = append(out, left[bi])
		left = append(left[:bi], left[bi+1:]...)
	}
	return out
}
