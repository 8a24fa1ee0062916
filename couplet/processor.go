package couplet

import (
	"math"

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
// Rules, by position:
//   - template punctuation is forced in both lines (rule 1);
//   - every other line slot and banner slot allows Chinese characters only
//     (rules 1, 4); specials are allowed only where the layout puts them;
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
//     is valid only if K2 is 仄. A headFirst constraint instead forces the
//     keyword at the start of the 上联 (deadline 0); Generate gives it to
//     every other sample, so ranking chooses between the model's own
//     placement and the head placement.
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
		for j := 0; j+1 < p.lineLen; j++ {
			if p.template[j] != -1 || p.template[j+1] != -1 {
				continue
			}
			if j+1 == c.last && t.tone[k2] != ToneZe {
				continue
			}
			c.kwStart[j] = true
			c.deadline = j
		}
		if len(headFirst) > 0 && headFirst[0] && c.kwStart[0] {
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

// force leaves only id allowed.
func force(logits []float32, id int32) error {
	if id < 0 || int(id) >= len(logits) || math.IsNaN(float64(logits[id])) || math.IsInf(float64(logits[id]), -1) {
		return sampler.ErrDeadEnd
	}
	v := logits[id]
	for i := range logits {
		logits[i] = negInf
	}
	logits[id] = v
	return nil
}

// allowHan leaves only Chinese-character ids for which ok returns true.
func (c *constraint) allowHan(logits []float32, ok func(id int32) bool) error {
	alive := false
	for i := range logits {
		id := int32(i)
		if i >= len(c.t.class) || c.t.class[i] != classHan || (ok != nil && !ok(id)) {
			logits[i] = negInf
			continue
		}
		if !math.IsInf(float64(logits[i]), -1) && !math.IsNaN(float64(logits[i])) {
			alive = true
		}
	}
	if !alive {
		return sampler.ErrDeadEnd
	}
	return nil
}

// Process implements sampler.LogitsProcessor.
func (c *constraint) Process(generated []int32, logits []float32) error {
	pos := len(generated)
	L := c.p.lineLen
	sp := c.t.sp
	var upper []int32
	if c.p.mode == ModeLower {
		upper = c.p.upper
	} else {
		if pos < L {
			return c.upperStep(generated, pos, logits)
		}
		if pos == L {
			return force(logits, sp.Sep)
		}
		upper = generated[:L]
		generated = generated[L+1:]
		pos -= L + 1
	}
	switch {
	case pos < L:
		return c.lowerStep(upper, generated, pos, logits)
	case pos == L:
		return force(logits, sp.Banner)
	case pos <= L+4:
		return c.allowHan(logits, nil)
	case pos == L+5:
		return force(logits, sp.EOS)
	}
	return sampler.ErrDeadEnd
}

func (c *constraint) upperStep(gen []int32, j int, logits []float32) error {
	p, t := c.p, c.t
	if p.template[j] != -1 {
		return force(logits, p.template[j])
	}
	if p.mode == ModeAcrostic && j == 0 {
		return force(logits, p.heads[0])
	}
	if p.mode == ModeKeyword {
		k1, k2 := p.heads[0], p.heads[1]
		placed := false
		for s := 0; s+1 < j; s++ {
			if c.kwStart[s] && gen[s] == k1 && gen[s+1] == k2 {
				placed = true
				break
			}
		}
		if !placed {
			if j > 0 && c.kwStart[j-1] && gen[j-1] == k1 {
				return force(logits, k2)
			}
			if j == c.deadline {
				return force(logits, k1)
			}
		}
		// Before placement K1 is only allowed where it can start the
		// keyword, so that emitting it always means "place it here".
		return c.allowHan(logits, func(id int32) bool {
			if !placed && id == k1 && !c.kwStart[j] {
				return false
			}
			return j != c.last || t.tone[id] == ToneZe
		})
	}
	return c.allowHan(logits, func(id int32) bool {
		if j != c.last {
			return true
		}
		if t.tone[id] != ToneZe {
			return false
		}
		// Acrostic: a last character equal to heads[0] mirrors heads[1]
		// onto the 下联's last slot, which must be 平.
		return !(p.mode == ModeAcrostic && id == p.heads[0] && t.tone[p.heads[1]] != TonePing)
	})
}

func (c *constraint) lowerStep(upper, lower []int32, j int, logits []float32) error {
	p, t := c.p, c.t
	if p.template[j] != -1 {
		return force(logits, p.template[j])
	}
	if p.mode == ModeAcrostic && j == 0 {
		return force(logits, p.heads[1])
	}
	for k := 0; k < j; k++ {
		if p.template[k] == -1 && upper[k] == upper[j] {
			return force(logits, lower[k])
		}
	}
	needPing := upper[j] == upper[c.last]
	return c.allowHan(logits, func(id int32) bool {
		if id == upper[j] || (needPing && t.tone[id] != TonePing) {
			return false
		}
		for k := 0; k < j; k++ {
			if p.template[k] == -1 && lower[k] == id {
				return false
			}
		}
		return true
	})
}

// bannerProc is the processor of a 横批 written on its own after a
// finished couplet (the prompt ends with <ban>): four Chinese characters,
// then <eos>. Stateless, like constraint.
type bannerProc struct{ t *tables }

// Process implements sampler.LogitsProcessor.
func (b bannerProc) Process(generated []int32, logits []float32) error {
	switch pos := len(generated); {
	case pos < 4:
		return (&constraint{t: b.t}).allowHan(logits, nil)
	case pos == 4:
		return force(logits, b.t.sp.EOS)
	}
	return sampler.ErrDeadEnd
}
