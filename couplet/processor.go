package couplet

import (
	"math"
	"slices"
	"sort"

	"chunlian/sampler"
)

// constraint is the logits processor of one sample. It enforces the whole
// output form while the engine decodes (Generate now stops the request at
// the end of the 下联, linesLen, and writes the 横批 in a request of its
// own with bannerProc; the banner positions below still define the form):
//
//	keyword/acrostic: U1..UL <sep> L1..LL <ban> B1 B2 B3 B4 <eos>
//	lower:                     L1..LL <ban> B1 B2 B3 B4 <eos>
//
// where L is plan.lineLen (tokens per line, punctuation included). Its state
// is derived from `generated` on every call (the engine's record of the
// sample), so it holds nothing mutable: a constraint is created per sample
// and used only by the engine goroutine, but would be safe to share too.
//
// It is also a sampler.Forcer: Forced names the steps below that allow a
// single token (template punctuation, acrostic heads, K2 after K1, K1 at
// the deadline, mirrored repetitions, <sep>, <ban>, <eos>) from generated
// alone, and the sampler then returns that token without copying or
// scanning the row. Process forces the same tokens (both read the
// position through locate and forcedAt), so the two cannot disagree;
// bannerProc and forcedBanner do the same.
//
// Rules, by position:
//   - template punctuation is forced in both lines (rule 1);
//   - every other line slot and banner slot allows Chinese characters only
//     (rules 1, 4); specials are allowed only where the layout puts them;
//   - a 上联 slot does not repeat an earlier character, except the one
//     right before it once (叠字: appendEchoes);
//   - the 上联's last slot allows 仄 only, the 下联's last slot 平 only
//     (rule 2), and any 下联 slot j with u[j] == u[last] also 平 only, because
//     repetition mirroring will force l[last] = l[j] (lookahead: no dead end);
//   - 下联 slot j: if u[j] repeats an earlier u[k], l[j] is forced to l[k];
//     otherwise l[j] ≠ u[j] and l[j] differs from every earlier l[k]
//     (rule 3: no same character at the same position, mirrored repetition);
//   - acrostic: U1 = heads[0], L1 = heads[1]; U_last may be heads[0] only if
//     heads[1] is 平 (it would be mirrored onto L_last);
//   - keyword: the keyword is placed contiguously inside one clause of the
//     上联 where the model chooses; once the model emits K1 at a valid start,
//     K2 is forced next; if the model has not placed it by the last valid
//     start, K1 is forced there. A start whose K2 would land on the last slot
//     is valid only if no other start is and K2 is 仄. A headFirst
//     constraint instead forces the keyword at the start of the 上联
//     (deadline 0); Generate gives it to every other sample, so ranking
//     chooses between the model's own placement and the head placement.
//     A four-character phrase is its first half placed at the head of
//     every sample, with the last two characters forced after it.
type constraint struct {
	t *tables
	p *plan
	// kwStart[j]: the keyword may start at upper slot j (keyword mode).
	kwStart  []bool // [lineLen]
	deadline int    // last valid keyword start, -1 if not keyword mode
	last     int    // index of the last slot of a line (= lineLen-1)
}

// newConstraint builds the processor of a plan. headFirst (keyword mode)
// makes the keyword start the 上联 instead of letting the model choose.
func newConstraint(t *tables, p *plan, headFirst ...bool) *constraint {
	c := &constraint{t: t, p: p, deadline: -1, last: p.lineLen - 1}
	if p.mode == ModeKeyword {
		c.kwStart = make([]bool, p.lineLen)
		k2 := p.heads[1]
		// The keyword does not end the 上联 (docs/DECISIONS.md, "The
		// keyword does not end the 上联"), unless no other start exists.
		for _, atEnd := range []bool{false, true} {
			for j := 0; j+1 < p.lineLen; j++ {
				if p.template[j] != -1 || p.template[j+1] != -1 {
					continue
				}
				if j+1 == c.last && (!atEnd || t.tone[k2] != ToneZe) {
					continue
				}
				c.kwStart[j] = true
				c.deadline = j
			}
			if c.deadline >= 0 {
				break
			}
		}
		if (p.phrase || len(headFirst) > 0 && headFirst[0]) && c.kwStart[0] {
			c.deadline = 0
		}
	}
	return c
}

// genLen is the number of tokens of the whole constrained form, 横批 and
// <eos> included.
func (c *constraint) genLen() int {
	if c.p.mode == ModeLower {
		return c.p.lineLen + 6
	}
	return 2*c.p.lineLen + 7
}

// linesLen is the number of tokens up to the end of the 下联 (the
// candidate request stops there; the 横批 is written separately).
func (c *constraint) linesLen() int {
	if c.p.mode == ModeLower {
		return c.p.lineLen
	}
	return 2*c.p.lineLen + 1
}

var negInf = float32(math.Inf(-1))

// The processors only ever restrict a row to one of three fixed sets of ids
// (Han characters; Han characters of tone 仄; of tone 平), minus at most a
// line's worth of single ids (the keyword's first character, the 上联's
// character at the same slot, earlier 下联 characters). Instead of a pass
// over the whole row with a class lookup and a rule closure per token, each
// set is precomputed once per vocabulary (idSet: its ids and its
// complement), and a call writes -Inf over the complement, then over the
// few excluded ids, then looks for one live entry among the set's ids,
// stopping at the first (a model's row is finite almost everywhere, so this
// reads one or two entries unless the step is a dead end). The row comes
// out bit-identical to the old per-token loop's (kept in
// processor_ref_test.go, checked by TestProcessorEquivalence): allowed
// entries untouched, every other entry -Inf, and ErrDeadEnd exactly when no
// allowed entry is above -Inf (NaN counts as dead, as before).

// idSet is one allowed set of the processors, over the vocabulary
// [0, v): allow holds its ids and deny the rest, both ascending.
type idSet struct {
	allow, deny []int32
	v           int            // len(tables.class)
	ids         *sampler.IDSet // the same set as a bitset, for Mask (device draws)
}

// newIDSet splits [0, v) by in.
func newIDSet(v int, in func(id int32) bool) idSet {
	s := idSet{v: v, ids: sampler.NewIDSet(v, in)}
	for id := int32(0); int(id) < v; id++ {
		if in(id) {
			s.allow = append(s.allow, id)
		} else {
			s.deny = append(s.deny, id)
		}
	}
	return s
}

// buildSets fills the tables' processor sets; newTables calls it.
func (t *tables) buildSets() {
	v := len(t.class)
	t.hanSet = newIDSet(v, func(id int32) bool { return t.class[id] == classHan })
	t.zeSet = newIDSet(v, func(id int32) bool { return t.class[id] == classHan && t.tone[id] == ToneZe })
	t.pingSet = newIDSet(v, func(id int32) bool { return t.class[id] == classHan && t.tone[id] == TonePing })
}

// restrict writes -Inf over every entry of logits outside s (ids of the
// complement, and any ids beyond the vocabulary a wider row may have).
func restrict(logits []float32, s *idSet) {
	deny := s.deny
	if len(logits) < s.v { // a narrower row: only the ids it has
		deny = deny[:sort.Search(len(deny), func(i int) bool { return int(deny[i]) >= len(logits) })]
	}
	for _, id := range deny {
		logits[id] = negInf
	}
	for i := s.v; i < len(logits); i++ {
		logits[i] = negInf
	}
}

// exclude writes -Inf at id if the row has it.
func exclude(logits []float32, id int32) {
	if id >= 0 && int(id) < len(logits) {
		logits[id] = negInf
	}
}

// alive returns nil if some id of s holds a value above -Inf (neither -Inf
// nor NaN; excluded ids were already set to -Inf), else ErrDeadEnd.
func alive(logits []float32, s *idSet) error {
	for _, id := range s.allow {
		if int(id) >= len(logits) {
			break
		}
		if logits[id] > negInf {
			return nil
		}
	}
	return sampler.ErrDeadEnd
}

// part is where in a sample's sequence the next token goes.
type part int

const (
	partUpper  part = iota // 上联 slot j
	partSep                // <sep>
	partLower              // 下联 slot j
	partBan                // <ban>
	partBanner             // 横批 slot (any of the four)
	partEOS                // <eos>
	partPast               // after <eos>: nothing is allowed
)

// locate returns where the token after generated goes: the part, the slot
// j within a line, the 上联 (so far, in partUpper; given, in lower mode)
// and the 下联 so far. Forced and Process both read it, so they agree on
// the position by construction.
func (c *constraint) locate(generated []int32) (pt part, j int, upper, lower []int32) {
	pos := len(generated)
	L := c.p.lineLen
	upper = c.p.upper
	if c.p.mode != ModeLower {
		if pos < L {
			return partUpper, pos, generated, nil
		}
		if pos == L {
			return partSep, 0, generated, nil
		}
		upper = generated[:L]
		generated = generated[L+1:]
		pos -= L + 1
	}
	switch {
	case pos < L:
		return partLower, pos, upper, generated
	case pos == L:
		return partBan, 0, upper, generated
	case pos <= L+4:
		return partBanner, 0, upper, generated
	case pos == L+5:
		return partEOS, 0, upper, generated
	}
	return partPast, 0, upper, generated
}

// Forced implements sampler.Forcer: the token of every step Process
// forces (template punctuation, acrostic heads, the keyword's K2 after K1
// and K1 at the deadline, mirrored repetitions in the 下联, <sep>, <ban>,
// <eos>). It reads only generated; Process forces the same tokens through
// forcedAt, so the two agree by construction.
func (c *constraint) Forced(generated []int32, _ []float32) (int32, bool) {
	return c.forcedAt(c.locate(generated))
}

// forcedAt is Forced at a located position.
func (c *constraint) forcedAt(pt part, j int, upper, lower []int32) (int32, bool) {
	sp := c.t.sp
	switch pt {
	case partUpper:
		return c.upperForced(upper, j)
	case partSep:
		return sp.Sep, true
	case partLower:
		return c.lowerForced(upper, lower, j)
	case partBan:
		return sp.Banner, true
	case partEOS:
		return sp.EOS, true
	}
	return 0, false
}

// rule is a step's constraint: a forced token (forced; id -1 is a dead
// end whatever the row), or the tokens of set minus the ids it appends to
// excl. Process applies it to a row and Mask hands it to a device, so the
// two cannot disagree; TestProcessorEquivalence checks both against the
// reference processors.
type rule struct {
	forced bool
	id     int32
	set    *idSet
}

// apply does r (and excl) to logits, as Process.
func (r rule) apply(logits []float32, excl []int32) error {
	if r.forced {
		return sampler.Force(logits, r.id)
	}
	restrict(logits, r.set)
	for _, id := range excl {
		exclude(logits, id)
	}
	return alive(logits, r.set)
}

// mask says r (and excl) as a sampler.Mask.
func (r rule) mask(m *sampler.Mask, excl []int32) {
	m.Reset()
	if r.forced {
		m.Forced, m.Force = true, r.id
		return
	}
	m.Allowed, m.Exclude = r.set.ids, append(m.Exclude, excl...)
}

// Process implements sampler.LogitsProcessor.
func (c *constraint) Process(generated []int32, logits []float32) error {
	var buf [32]int32
	r, excl := c.ruleAt(generated, buf[:0])
	return r.apply(logits, excl)
}

// Mask implements sampler.Masker: every step of a couplet sample is a
// pure mask, so the GPU can apply it and draw there.
func (c *constraint) Mask(generated []int32, m *sampler.Mask) bool {
	var buf [32]int32
	r, excl := c.ruleAt(generated, buf[:0])
	r.mask(m, excl)
	return true
}

// ruleAt is the constraint on the token after generated (see rule); its
// excluded ids are appended to excl.
func (c *constraint) ruleAt(generated, excl []int32) (rule, []int32) {
	pt, j, upper, lower := c.locate(generated)
	if id, ok := c.forcedAt(pt, j, upper, lower); ok {
		return rule{forced: true, id: id}, excl
	}
	switch pt {
	case partUpper:
		return c.upperRule(upper, j, excl)
	case partLower:
		return c.lowerRule(upper, lower, j, excl)
	case partBanner:
		return rule{set: &c.t.hanSet}, excl
	}
	return rule{forced: true, id: -1}, excl // nothing is allowed
}

// placed reports whether the keyword sits complete in the 上联's first j
// characters gen[:j] (at a valid start).
func (c *constraint) placed(gen []int32, j int) bool {
	k1, k2 := c.p.heads[0], c.p.heads[1]
	for s := 0; s+1 < j; s++ {
		if c.kwStart[s] && gen[s] == k1 && gen[s+1] == k2 {
			return true
		}
	}
	return false
}

// upperForced is Forced for 上联 slot j.
func (c *constraint) upperForced(gen []int32, j int) (int32, bool) {
	p := c.p
	if p.template[j] != -1 {
		return p.template[j], true
	}
	if p.mode == ModeAcrostic && j == 0 {
		return p.heads[0], true
	}
	if p.phrase && (j == 2 || j == 3) {
		return p.tail[j-2], true
	}
	if p.mode == ModeKeyword && !c.placed(gen, j) {
		if j > 0 && c.kwStart[j-1] && gen[j-1] == p.heads[0] {
			return p.heads[1], true
		}
		if j == c.deadline {
			return p.heads[0], true
		}
	}
	return 0, false
}

// lowerForced is Forced for 下联 slot j.
func (c *constraint) lowerForced(upper, lower []int32, j int) (int32, bool) {
	p := c.p
	if p.template[j] != -1 {
		return p.template[j], true
	}
	if p.mode == ModeAcrostic && j == 0 {
		return p.heads[1], true
	}
	for k := 0; k < j; k++ {
		if p.template[k] == -1 && upper[k] == upper[j] {
			return lower[k], true
		}
	}
	return 0, false
}

// upperRule is ruleAt for 上联 slot j where forcedAt forces nothing.
func (c *constraint) upperRule(gen []int32, j int, excl []int32) (rule, []int32) {
	p, t := c.p, c.t
	// Han characters, 仄 only on the last slot, in every mode.
	r := rule{set: &t.hanSet}
	if j == c.last {
		r.set = &t.zeSet
	}
	excl = appendEchoes(excl, gen, j)
	switch {
	case p.mode == ModeKeyword:
		// Before placement K1 is only allowed where it can start the
		// keyword, so that emitting it always means "place it here".
		if !c.placed(gen, j) && !c.kwStart[j] {
			excl = append(excl, p.heads[0])
		}
		if p.phrase {
			// After a phrase the 上联 does not repeat its characters
			// (年年有余年年富, 大吉大利大吉利).
			excl = append(excl, p.heads[0], p.heads[1], p.tail[0], p.tail[1])
		}
	case j == c.last && p.mode == ModeAcrostic && t.tone[p.heads[1]] != TonePing:
		// A last character equal to heads[0] mirrors heads[1] onto the
		// 下联's last slot, which must be 平.
		excl = append(excl, p.heads[0])
	}
	return r, excl
}

// appendEchoes appends to excl the characters 上联 slot j may not take
// because they would repeat an earlier one: a line repeats a character
// only right after itself, once (叠字 年年). Readers mark our couplets
// with any other repeat odd about twice as often as the rest
// (docs/DECISIONS.md, "No echoes in the 上联"); the 下联 mirrors the
// 上联's repeats, so it has none either.
func appendEchoes(excl, gen []int32, j int) []int32 {
	for k := 0; k < j; k++ {
		if k < j-1 || slices.Contains(gen[:k], gen[k]) {
			excl = append(excl, gen[k])
		}
	}
	return excl
}

// lowerRule is ruleAt for 下联 slot j where forcedAt forces nothing: Han
// characters (平 only where u[j] == u[last]), not u[j], not an earlier
// 下联 character.
func (c *constraint) lowerRule(upper, lower []int32, j int, excl []int32) (rule, []int32) {
	p, t := c.p, c.t
	r := rule{set: &t.hanSet}
	if upper[j] == upper[c.last] {
		r.set = &t.pingSet
	}
	excl = append(excl, upper[j])
	for k := 0; k < j; k++ {
		if p.template[k] == -1 {
			excl = append(excl, lower[k])
		}
	}
	return r, excl
}

// bannerProc is the processor of a 横批 written on its own after a
// finished couplet (the prompt ends with <ban>): four Chinese characters,
// then <eos>. Stateless, like constraint.
type bannerProc struct{ t *tables }

// ruleAt is the constraint on the token after generated: four Chinese
// characters, then <eos>, then nothing.
func (b bannerProc) ruleAt(generated []int32) rule {
	switch pos := len(generated); {
	case pos < 4:
		return rule{set: &b.t.hanSet}
	case pos == 4:
		return rule{forced: true, id: b.t.sp.EOS}
	}
	return rule{forced: true, id: -1}
}

// Process implements sampler.LogitsProcessor.
func (b bannerProc) Process(generated []int32, logits []float32) error {
	return b.ruleAt(generated).apply(logits, nil)
}

// Mask implements sampler.Masker (see Process).
func (b bannerProc) Mask(generated []int32, m *sampler.Mask) bool {
	b.ruleAt(generated).mask(m, nil)
	return true
}

// Forced implements sampler.Forcer: <eos> after the four characters.
func (b bannerProc) Forced(generated []int32, _ []float32) (int32, bool) {
	return b.t.sp.EOS, len(generated) == 4
}
