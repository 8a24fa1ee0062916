package couplet

import (
	"math"

	"chunlian/sampler"
)

// The processors as they were before the precomputed id sets (commit
// ffd5f6d): a pass over the whole row per call, a class lookup, an optional
// closure call and IsInf/IsNaN per token. Kept as the reference of
// TestProcessorEquivalence and the "old" side of BenchmarkProcessRow.

func refForce(logits []float32, id int32) error {
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

func refAllowHan(t *tables, logits []float32, ok func(id int32) bool) error {
	alive := false
	for i := range logits {
		id := int32(i)
		if i >= len(t.class) || t.class[i] != classHan || (ok != nil && !ok(id)) {
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

// refProc is the old constraint.Process over c's plan and tables.
type refProc struct{ c *constraint }

func (r refProc) Process(generated []int32, logits []float32) error {
	c := r.c
	pos := len(generated)
	L := c.p.lineLen
	sp := c.t.sp
	var upper []int32
	if c.p.mode == ModeLower {
		upper = c.p.upper
	} else {
		if pos < L {
			return r.upperStep(generated, pos, logits)
		}
		if pos == L {
			return refForce(logits, sp.Sep)
		}
		upper = generated[:L]
		generated = generated[L+1:]
		pos -= L + 1
	}
	switch {
	case pos < L:
		return r.lowerStep(upper, generated, pos, logits)
	case pos == L:
		return refForce(logits, sp.Banner)
	case pos <= L+4:
		return refAllowHan(c.t, logits, nil)
	case pos == L+5:
		return refForce(logits, sp.EOS)
	}
	return sampler.ErrDeadEnd
}

func (r refProc) upperStep(gen []int32, j int, logits []float32) error {
	c := r.c
	p, t := c.p, c.t
	if p.template[j] != -1 {
		return refForce(logits, p.template[j])
	}
	if p.mode == ModeAcrostic && j == 0 {
		return refForce(logits, p.heads[0])
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
				return refForce(logits, k2)
			}
			if j == c.deadline {
				return refForce(logits, k1)
			}
		}
		return refAllowHan(t, logits, func(id int32) bool {
			if !placed && id == k1 && !c.kwStart[j] || refEcho(gen, j, id) {
				return false
			}
			return j != c.last || t.tone[id] == ToneZe
		})
	}
	return refAllowHan(t, logits, func(id int32) bool {
		if refEcho(gen, j, id) {
			return false
		}
		if j != c.last {
			return true
		}
		if t.tone[id] != ToneZe {
			return false
		}
		return !(p.mode == ModeAcrostic && id == p.heads[0] && t.tone[p.heads[1]] != TonePing)
	})
}

// refEcho reports whether id at 上联 slot j would repeat an earlier
// character other than as one 叠字 right after it (token ids, or the runes
// of a returned 上联).
func refEcho[T comparable](gen []T, j int, id T) bool {
	n := 0
	for k := 0; k < j; k++ {
		if gen[k] == id {
			n++
		}
	}
	return n > 1 || n == 1 && gen[j-1] != id // n == 1 implies j ≥ 1
}

func (r refProc) lowerStep(upper, lower []int32, j int, logits []float32) error {
	c := r.c
	p, t := c.p, c.t
	if p.template[j] != -1 {
		return refForce(logits, p.template[j])
	}
	if p.mode == ModeAcrostic && j == 0 {
		return refForce(logits, p.heads[1])
	}
	for k := 0; k < j; k++ {
		if p.template[k] == -1 && upper[k] == upper[j] {
			return refForce(logits, lower[k])
		}
	}
	needPing := upper[j] == upper[c.last]
	return refAllowHan(t, logits, func(id int32) bool {
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

// refBanner is the old bannerProc.
type refBanner struct{ t *tables }

func (b refBanner) Process(generated []int32, logits []float32) error {
	switch pos := len(generated); {
	case pos < 4:
		return refAllowHan(b.t, logits, nil)
	case pos == 4:
		return refForce(logits, b.t.sp.EOS)
	}
	return sampler.ErrDeadEnd
}
