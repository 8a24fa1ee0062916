package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"chunlian/forward"
	"chunlian/forward/forwardtest"
	"chunlian/sampler"
)

// maskProc is a test processor that is a pure mask at every step: allowed
// set by step, the last generated token excluded, and every fourth step a
// forced token (sometimes outside the vocabulary: a dead end).
type maskProc struct {
	sets  []*sampler.IDSet
	vocab int
}

func (p maskProc) describe(gen []int32, m *sampler.Mask) {
	m.Reset()
	if len(gen)%4 == 3 {
		m.Forced, m.Force = true, int32(len(gen)*7%(p.vocab+1))
		return
	}
	m.Allowed = p.sets[len(gen)%len(p.sets)]
	if len(gen) > 0 {
		m.Exclude = append(m.Exclude, gen[len(gen)-1])
	}
}

func (p maskProc) Process(gen []int32, row []float32) error {
	var m sampler.Mask
	p.describe(gen, &m)
	return m.Apply(row)
}

// maskerProc is maskProc that says so (sampler.Masker): drawn on the device.
type maskerProc struct{ maskProc }

func (p maskerProc) Mask(gen []int32, m *sampler.Mask) bool { p.describe(gen, m); return true }

// peekProc forces, at every step, the id with the highest logit among a
// few step-dependent ids, reading the row only there: its Mask lists
// them in sampler.Mask.Peek (like couplet's forced 横批 samples on their first step). Samples with
// the same shift peek the same ids at the same step (as the 横批 samples
// do), others different ones.
type peekProc struct{ vocab, shift int }

func (p peekProc) peek(gen []int32) []int32 {
	k := len(gen) + p.shift
	return []int32{int32(k % p.vocab), int32((k*5 + 3) % p.vocab), int32((k*11 + 7) % p.vocab)}
}

func (p peekProc) Mask(gen []int32, m *sampler.Mask) bool {
	m.Reset()
	m.Peek = append(m.Peek, p.peek(gen)...)
	return false
}

func (p peekProc) Forced(gen []int32, row []float32) (int32, bool) {
	ids := p.peek(gen)
	best := int32(-1)
	for _, id := range ids {
		if v := row[id]; v > negInf32 && (best < 0 || v > row[best] || (v == row[best] && id < best)) {
			best = id
		}
	}
	return best, true
}

func (p peekProc) Process(gen []int32, row []float32) error {
	id, _ := p.Forced(gen, row)
	return sampler.Force(row, id) // ErrDeadEnd for id -1 (no peeked id above -Inf)
}

// countDraws counts what the engine asks of an AsyncDrawBackend, and how
// often two steps were in flight at once.
type countDraws struct {
	forward.AsyncDrawBackend
	steps, draws, hostRows, rows, forced atomic.Int64
	inflight, overlapped                 atomic.Int64
}

func (c *countDraws) count(b *forward.Batch, d []forward.Draw, host []int32) {
	c.steps.Add(1)
	c.draws.Add(int64(len(d)))
	c.hostRows.Add(int64(len(host)))
	c.rows.Add(int64(len(b.LogitRows)))
	for i := range d {
		if d[i].Force >= 0 {
			c.forced.Add(1)
		}
	}
}

func (c *countDraws) ForwardDraw(b *forward.Batch, d []forward.Draw, out []forward.Drawn, host []int32, logits []float32) error {
	c.count(b, d, host)
	return c.AsyncDrawBackend.ForwardDraw(b, d, out, host, logits)
}

func (c *countDraws) LaunchDraw(slot int, b *forward.Batch, d []forward.Draw, host []int32) error {
	c.count(b, d, host)
	if c.inflight.Add(1) == 2 {
		c.overlapped.Add(1)
	}
	return c.AsyncDrawBackend.LaunchDraw(slot, b, d, host)
}

func (c *countDraws) WaitDraw(slot int, out []forward.Drawn, logits []float32, lse []float32) error {
	c.inflight.Add(-1)
	return c.AsyncDrawBackend.WaitDraw(slot, out, logits, lse)
}

// drawRequests is genRequests with processors: masker (device draws),
// plain mask processors (host rows) and none, mixed; with peek, every
// fourth request gets a peekProc (peeked logits) instead.
func drawRequests(seed uint64, k, vocab int, greedy, peek bool) []*Request {
	reqs := genRequests(seed, k, vocab, 30, 40)
	rng := rand.New(rand.NewPCG(seed, 2))
	var sets []*sampler.IDSet
	for range 3 {
		keep := rng.Uint64()
		sets = append(sets, sampler.NewIDSet(vocab, func(id int32) bool { return keep>>(id%64)&1 == 1 || id%5 == 0 }))
	}
	mp := maskProc{sets: sets, vocab: vocab}
	for i, r := range reqs {
		if greedy {
			r.Params.Temperature = 0
		}
		switch {
		case peek && i%4 == 3:
			// Samples 0 and 1 peek the same ids, 2 and 3 others, …
			r.NewProcessor = func(i int) sampler.LogitsProcessor { return peekProc{vocab, i / 2} }
		case i%3 == 0:
			r.NewProcessor = func(int) sampler.LogitsProcessor { return maskerProc{mp} }
		case i%3 == 1:
			r.NewProcessor = func(int) sampler.LogitsProcessor { return mp }
		}
	}
	return reqs
}

// TestDeviceDrawsGreedyMatchHost: with draws planned for the device
// (forwardtest.HostDraws runs sampler.DrawRow, the GPU's definition), greedy
// results — tokens, log-probs, prompt log-probs, dead ends, n > 1 — are
// exactly the host path's, whatever the chunking, preemption and prefix
// hits, one step at a time (below OverlapMinSeqs) and with two steps in
// flight (overlapRunner); and the device path did draw (fewer rows crossed than
// computed), and the overlapping engine did have two steps in flight.
func TestDeviceDrawsGreedyMatchHost(t *testing.T) {
	const vocab = 24
	for _, tc := range engineCases {
		t.Run(tc.name, func(t *testing.T) {
			reqs := drawRequests(tc.seed, 30, vocab, true, true)
			// The host path: the same backend with its draws hidden (it
			// keeps the row log-sum-exps), so the engine samples on the host.
			host, err := New(hostOnly{forwardtest.HostDraws(newFake(tc.blocks, tc.bs, vocab))}, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if host.deviceDraws() {
				t.Fatal("engine on a host-only backend plans device draws")
			}
			want := runConcurrent(t, host, reqs)
			for _, overlap := range []bool{false, true} {
				cfg := tc.cfg
				if cfg == (Config{}) {
					cfg = DefaultConfig()
				}
				// Overlap from 2 sequences (the tests' loads are small), or
				// never: one step at a time.
				cfg.OverlapMinSeqs = 2
				if !overlap {
					cfg.OverlapMinSeqs = 1 << 30
				}
				t.Run(fmt.Sprintf("overlap %v", overlap), func(t *testing.T) {
					checkDeviceDraws(t, tc.blocks, tc.bs, vocab, cfg, reqs, want, overlap)
				})
			}
			checkDrained(t, host)
		})
	}
}

// hostOnly is a draw backend whose DrawVocab says no, so the engine
// samples on the host while the backend keeps its row log-sum-exps.
type hostOnly struct {
	forward.DrawBackend
}

func (hostOnly) DrawVocab() bool { return false }

// checkDeviceDraws runs reqs on a device-draw engine and compares the
// results with the host path's (want).
func checkDeviceDraws(t *testing.T, blocks, bs, vocab int, cfg Config, reqs []*Request, want []*Result, overlap bool) {
	cd := &countDraws{AsyncDrawBackend: forwardtest.HostDraws(newFake(blocks, bs, vocab))}
	dev, err := New(cd, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !dev.deviceDraws() || dev.ab == nil {
		t.Fatalf("device draws %v, async backend %v", dev.deviceDraws(), dev.ab != nil)
	}
	got := runConcurrent(t, dev, reqs)
	dead := 0
	for i := range reqs {
		if err := sameResult(got[i], want[i]); err != nil {
			t.Errorf("request %d (%+v): %v", i, reqs[i].Params, err)
		}
		for _, c := range got[i].Completions {
			if c.Finish == FinishDeadEnd {
				dead++
			}
		}
	}
	if cd.draws.Load() == 0 || cd.hostRows.Load() >= cd.rows.Load() {
		t.Errorf("device path: %d draws, %d of %d rows copied", cd.draws.Load(), cd.hostRows.Load(), cd.rows.Load())
	}
	if dead == 0 {
		t.Error("no dead end: the forced-outside-vocabulary case went untested")
	}
	// One sequence a step leaves no second group when a request's greedy
	// samples all ride one sequence (sequence.host).
	if overlap && cd.overlapped.Load() == 0 && cfg.MaxNumSeqs != 1 {
		t.Error("never two steps in flight")
	}
	if !overlap && cd.overlapped.Load() != 0 {
		t.Errorf("%d steps with two in flight below OverlapMinSeqs", cd.overlapped.Load())
	}

	t.Logf("%d steps (%d with two in flight), %d draws, %d of %d rows copied, %d dead ends", cd.steps.Load(), cd.overlapped.Load(), cd.draws.Load(), cd.hostRows.Load(), cd.rows.Load(), dead)
	checkDrained(t, dev)
	if dev.peekedRows == 0 { // the loop has exited: read after Close
		t.Error("no row was made from peeked logits")
	}
	if dev.peekShared == 0 {
		t.Error("no sample shared the peeked draws of the sample before it (n > 1 forks)")
	}
	// Between steps the reused peeked rows are -Inf everywhere (the
	// peeked entries were put back after sampling).
	for i := range dev.bufs {
		b := &dev.bufs[i]
		for k, v := range b.logits[:b.dp.peekClean*vocab] {
			if v != negInf32 {
				t.Fatalf("stepBuf %d: logits[%d] (row %d of %d clean) = %v after the run", i, k, k/vocab, b.dp.peekClean, v)
			}
		}
	}
}

// TestDeviceDrawsSampled: sampled draws on the device path obey every
// processor, and the same seeds give the same results on a second engine.
func TestDeviceDrawsSampled(t *testing.T) {
	const vocab = 24
	reqs := drawRequests(9, 40, vocab, false, false)
	run := func() []*Result {
		e, err := New(forwardtest.HostDraws(newFake(512, 4, vocab)), Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer checkDrained(t, e)
		return runConcurrent(t, e, reqs)
	}
	a, b := run(), run()
	checked := 0
	for i, r := range reqs {
		if err := sameResult(a[i], b[i]); err != nil {
			t.Errorf("request %d: not reproducible: %v", i, err)
		}
		if r.NewProcessor == nil {
			continue
		}
		for _, c := range a[i].Completions {
			p := r.NewProcessor(c.Index)
			for j, tok := range c.Tokens {
				row := make([]float32, vocab) // all zeros: allowed = finite after Process
				if err := p.Process(c.Tokens[:j], row); err != nil {
					t.Fatalf("request %d sample %d step %d: drew %d where the processor allows nothing", i, c.Index, j, tok)
				}
				if !(row[tok] == 0) {
					t.Fatalf("request %d sample %d step %d: drew %d, which the processor forbids", i, c.Index, j, tok)
				}
				checked++
			}
		}
	}
	// Samples of one request have their own random streams (sampler.New
	// with their index, also when a device plan made them before the fork).
	multi, same := 0, 0
	for i, r := range reqs {
		if r.Params.N < 2 || r.Params.Temperature == 0 || r.Params.MaxTokens < 6 {
			continue
		}
		multi++
		c := a[i].Completions
		if slices.Equal(c[0].Tokens, c[1].Tokens) {
			same++
		}
	}
	if multi == 0 || 2*same >= multi {
		t.Errorf("%d of %d sampled requests with N ≥ 2 have identical first two samples", same, multi)
	}
	if checked < 100 {
		t.Fatalf("only %d tokens checked", checked)
	}
	t.Logf("%d processed tokens checked", checked)
}

// runProc forces runs of tokens, as the couplet rules do: steps 2–4 of
// every six are forced (to a token that depends on the one before, so
// samples differ; step 16 to the request's stop token, step 22 outside
// the vocabulary, if dead is 22: a dead end), and so are the first lead
// steps; the others are allowed from a set. It says so
// only through Mask (no Forcer): the host path runs Process.
type runProc struct {
	set   *sampler.IDSet
	vocab int
	stop  int32 // -1: none
	dead  int   // the step forced outside the vocabulary (0: none)
	lead  int   // forced steps at the start
}

func (p runProc) Mask(gen []int32, m *sampler.Mask) bool {
	m.Reset()
	k := len(gen)
	if k >= p.lead && (k%6 < 2 || k%6 > 4) {
		m.Allowed = p.set
		return true
	}
	prev := 7
	if k > 0 {
		prev = int(gen[k-1])
	}
	m.Forced, m.Force = true, int32((prev*5+k)%p.vocab)
	switch {
	case k == 16 && p.stop >= 0:
		m.Force = p.stop
	case k == p.dead:
		m.Force = int32(p.vocab)
	}
	return true
}

func (p runProc) Process(gen []int32, row []float32) error {
	var m sampler.Mask
	p.Mask(gen, &m)
	return m.Apply(row)
}

// TestJumpForwardMatchesStepByStep: appending forced runs as one chunk
// (jump-forward) gives exactly the results of one step per token —
// tokens, log-probs, finishes, events in order, greedy and seeded — on the
// host path and on device draws with two steps in flight, whatever the
// chunking, preemption and prefix hits, also when the first tokens are
// forced (a lone sample's join its prompt's chunk); and it takes fewer
// steps and samples fewer tokens.
func TestJumpForwardMatchesStepByStep(t *testing.T) {
	const vocab = 24
	set := sampler.NewIDSet(vocab, func(id int32) bool { return id%3 != 1 })
	for _, tc := range engineCases {
		for _, c := range []struct {
			device bool
			lead   int
		}{{false, 0}, {true, 0}, {false, 3}, {true, 3}} {
			device := c.device
			t.Run(fmt.Sprintf("%s/device %v/lead %d", tc.name, device, c.lead), func(t *testing.T) {
				run := func(jump bool) ([]*Result, [][]Event, Stats) {
					reqs := genRequests(tc.seed, tc.k, vocab, 30, 40)
					events := make([][]Event, len(reqs))
					for i, r := range reqs {
						stop := int32(-1)
						if len(r.Params.StopTokens) > 0 {
							stop = r.Params.StopTokens[0]
						}
						r.NewProcessor = func(int) sampler.LogitsProcessor { return runProc{set, vocab, stop, 22, c.lead} }
						r.OnEvent = func(ev Event) { events[i] = append(events[i], ev) }
					}
					cfg := tc.cfg
					if cfg == (Config{}) {
						cfg = DefaultConfig()
					}
					cfg.noJump = !jump
					e := drawEngine(t, tc.blocks, tc.bs, vocab, cfg, device)
					res := runConcurrent(t, e, reqs)
					st := e.Stats()
					checkDrained(t, e)
					return res, events, st
				}
				reqs0 := genRequests(tc.seed, tc.k, vocab, 30, 40)
				want, wantEv, off := run(false)
				got, gotEv, on := run(true)
				for i := range want {
					if err := sameResult(got[i], want[i]); err != nil {
						t.Errorf("request %d: %v", i, err)
					}
					// Samples interleave differently; each sample's own
					// events come in the same order.
					for k := range max(1, reqs0[i].Params.N) {
						g, w := sampleEvents(gotEv[i], k), sampleEvents(wantEv[i], k)
						if !slices.Equal(g, w) {
							t.Errorf("request %d sample %d: events %v, step by step %v", i, k, g, w)
						}
					}
				}
				// (Steps and computed rows depend on when the requests
				// arrive; the tokens sampled do not.)
				if off.JumpTokens != 0 || on.JumpTokens == 0 || on.SampledTokens >= off.SampledTokens {
					t.Errorf("jump-forward: %d jumped, %d sampled; step by step %d, %d",
						on.JumpTokens, on.SampledTokens, off.JumpTokens, off.SampledTokens)
				}
				if on.SampledTokens+on.JumpTokens < on.GenTokens || off.SampledTokens < off.GenTokens {
					t.Errorf("generated %d > %d sampled + %d jumped", on.GenTokens, on.SampledTokens, on.JumpTokens)
				}
				t.Logf("steps %d → %d, sampled %d → %d (+%d jumped), computed %d → %d, logit rows %d → %d",
					off.Steps, on.Steps, off.SampledTokens, on.SampledTokens, on.JumpTokens, off.ComputedTokens, on.ComputedTokens, off.LogitRows, on.LogitRows)
			})
		}
	}
}

// drawEngine is an engine with cfg on a fake backend; with device, the
// backend draws tokens "on the device" (forwardtest.HostDraws) and two
// steps are in flight from 2 sequences on.
func drawEngine(t *testing.T, blocks, bs, vocab int, cfg Config, device bool) *Paged {
	t.Helper()
	var b forward.Backend = newFake(blocks, bs, vocab)
	if device {
		b = forwardtest.HostDraws(b)
		cfg.OverlapMinSeqs = 2
	}
	e, err := New(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// sampleEvents returns the events of sample k.
func sampleEvents(evs []Event, k int) []Event {
	var out []Event
	for _, ev := range evs {
		if ev.Index == k {
			out = append(out, ev)
		}
	}
	return out
}

// TestJumpForwardSteps: a lone request whose rules force runs takes one
// step per run instead of one per token, and computes the same rows. Its
// forced first tokens join the prompt's step; when they are all it
// writes, that one step ends it.
func TestJumpForwardSteps(t *testing.T) {
	const vocab = 24
	set := sampler.NewIDSet(vocab, func(id int32) bool { return id%3 != 1 })
	for _, c := range []struct {
		lead, maxTokens        int
		steps, jumped, sampled int64
	}{
		// 20 tokens: steps 2–4, 8–10, 14–16 forced (9 tokens), MaxTokens at 20.
		{0, 20, 11, 9, 11},
		// Also 0–1: the prompt's step confirms 0–4 and samples 5.
		{3, 20, 9, 11, 9},
		// 0–2 forced and the last: one step, nothing sampled.
		{3, 3, 1, 3, 0},
	} {
		var st [2]Stats
		var toks [2][]int32
		for i, jump := range []bool{false, true} {
			cfg := DefaultConfig()
			cfg.noJump = !jump
			e, err := New(newFake(64, 4, vocab), cfg)
			if err != nil {
				t.Fatal(err)
			}
			res, err := e.Generate(context.Background(), &Request{
				Prompt: []int32{1, 2, 3}, Params: sampler.Params{MaxTokens: c.maxTokens, N: 1},
				NewProcessor: func(int) sampler.LogitsProcessor { return runProc{set, vocab, -1, 22, c.lead} },
			})
			if err != nil {
				t.Fatal(err)
			}
			if f := res.Completions[0].Finish; f != FinishLength || len(res.Completions[0].LogProbs) != c.maxTokens {
				t.Errorf("lead %d: finish %s with %d log-probs", c.lead, f, len(res.Completions[0].LogProbs))
			}
			if tm := res.Timings; tm.Prefill < 0 || tm.Queue+tm.Prefill > tm.Total {
				t.Errorf("lead %d: timings %+v", c.lead, tm)
			}
			toks[i], st[i] = res.Completions[0].Tokens, e.Stats()
			checkDrained(t, e)
		}
		if !slices.Equal(toks[0], toks[1]) || len(toks[1]) != c.maxTokens {
			t.Fatalf("lead %d: tokens %v, step by step %v", c.lead, toks[1], toks[0])
		}
		off, on := st[0], st[1]
		if off.Steps != int64(c.maxTokens) || on.Steps != c.steps || on.JumpTokens != c.jumped || on.SampledTokens != c.sampled || on.ComputedTokens != off.ComputedTokens {
			t.Errorf("lead %d: step by step: %d steps, %d rows; jump-forward: %d steps, %d rows, %d jumped, %d sampled",
				c.lead, off.Steps, off.ComputedTokens, on.Steps, on.ComputedTokens, on.JumpTokens, on.SampledTokens)
		}
	}
}

// countMask is runProc counting its Mask calls by position (len(gen)).
type countMask struct {
	runProc
	asked map[int]int
}

func (p *countMask) Mask(gen []int32, m *sampler.Mask) bool {
	p.asked[len(gen)]++
	return p.runProc.Mask(gen, m)
}

// TestMaskAskedOnce: on device draws the processor is asked for each
// position's mask once, the plan taking the one jumpForward left, and the
// tokens are those of the host path (log-probs come from the device's
// log-sum-exp there: TestDeviceDrawsGreedyMatchHost).
func TestMaskAskedOnce(t *testing.T) {
	const vocab = 24
	set := sampler.NewIDSet(vocab, func(id int32) bool { return id%3 != 1 })
	tc := engineCases[0]
	run := func(device bool) ([]*Result, []*countMask) {
		reqs := genRequests(tc.seed, tc.k, vocab, 30, 40)
		var procs []*countMask
		for _, r := range reqs {
			var ps []*countMask
			for range max(1, r.Params.N) {
				ps = append(ps, &countMask{runProc{set, vocab, -1, 0, 0}, map[int]int{}})
			}
			procs = append(procs, ps...)
			r.NewProcessor = func(i int) sampler.LogitsProcessor { return ps[i] }
		}
		e := drawEngine(t, tc.blocks, tc.bs, vocab, DefaultConfig(), device)
		res := runConcurrent(t, e, reqs)
		checkDrained(t, e)
		return res, procs
	}
	want, _ := run(false)
	got, procs := run(true)
	for i := range want {
		for k, c := range got[i].Completions {
			if w := want[i].Completions[k]; !slices.Equal(c.Tokens, w.Tokens) || c.Finish != w.Finish {
				t.Errorf("request %d sample %d: %v %s, host path %v %s", i, k, c.Tokens, c.Finish, w.Tokens, w.Finish)
			}
		}
	}
	asked := 0
	for i, p := range procs {
		for pos, n := range p.asked {
			asked += n
			if n != 1 {
				t.Fatalf("sample %d: position %d asked %d times", i, pos, n)
			}
		}
	}
	if asked < 100 {
		t.Fatalf("only %d masks asked", asked)
	}
}

// TestSequenceMaskStorage: a new sequence is one allocation (its sampler
// inside it), and its mask holds a couplet rule's few exclusions in
// storage that came with it, so jumpForward and the draw plan fill it
// without allocating on the engine goroutine.
func TestSequenceMaskStorage(t *testing.T) {
	e := &Paged{}
	r := &request{req: &Request{Prompt: []int32{1}}}
	excl := make([]int32, len(sequence{}.maskExcl))
	for i := range excl {
		excl[i] = int32(i)
	}
	tokens := []int32{1}
	alone := testing.AllocsPerRun(20, func() { e.newSeq(r, 0, tokens) })
	if alone != 1 {
		t.Errorf("a new sequence took %.0f allocations, want 1", alone)
	}
	filled := testing.AllocsPerRun(20, func() {
		s := e.newSeq(r, 0, tokens)
		s.mask.Reset()
		s.mask.Exclude = append(s.mask.Exclude, excl...)
	})
	if filled != alone {
		t.Errorf("a new sequence and %d exclusions in its mask: %.0f allocations, the sequence alone %.0f", len(excl), filled, alone)
	}
}
