package sampler

import "math"

// Mask is what a logits processor does to a row at one step, said without
// the row: either it forces one token, or it keeps the tokens of Allowed
// minus Exclude. A backend that draws tokens where the logits are (the GPU;
// forward.DrawBackend) applies it there, so that the row never has to
// reach the host.
type Mask struct {
	// Forced: the step allows exactly Force (Forcer's "force tok"; a Force
	// outside the vocabulary is a dead end).
	Forced bool
	Force  int32
	// Allowed is the set of allowed tokens (nil: every token); Exclude
	// lists tokens forbidden on top of it.
	Allowed *IDSet
	Exclude []int32
	// Peek, set only by a Mask call that reports false, lists the few ids
	// at which the step reads the row: Forced and Process, called on a row
	// that holds the true values at those ids and -Inf everywhere else,
	// behave exactly as on the whole row (same token, same error, same
	// side effects). A device-draw backend then sends back those values
	// instead of the whole row. Empty: the step needs the whole row.
	Peek []int32
}

// Masker is an optional interface of a LogitsProcessor whose Process is a
// pure mask at some steps. Mask fills m (reusing m.Exclude's storage) and
// reports true only where Process(generated, row) does, for every row,
// exactly what m says:
//   - m.Forced: what Forcer calls "force m.Force";
//   - else: set every entry outside m.Allowed and at m.Exclude to -Inf,
//     leave the others as they are, and return ErrDeadEnd exactly when no
//     allowed entry is above -Inf (NaN counts as -Inf).
//
// false means the step needs the row itself (for instance a processor
// whose first call reads the logits), possibly only at the ids it lists in
// m.Peek; the caller then runs Process. Mask
// may be called instead of Forced and Process and must not have side
// effects; it must be safe to call from the engine goroutine while no
// other call on the processor runs.
type Masker interface {
	Mask(generated []int32, m *Mask) bool
}

// Reset clears m for reuse, keeping Exclude's and Peek's storage.
func (m *Mask) Reset() {
	m.Forced, m.Force, m.Allowed, m.Exclude, m.Peek = false, 0, nil, m.Exclude[:0], m.Peek[:0]
}

// Apply does to row what m describes, as Masker's contract says Process
// does (tests compare the two; the host never needs it otherwise).
func (m *Mask) Apply(row []float32) error {
	negInf := float32(math.Inf(-1))
	if m.Forced {
		return Force(row, m.Force)
	}
	if m.Allowed != nil {
		for i := range row {
			if !m.Allowed.Has(int32(i)) {
				row[i] = negInf
			}
		}
	}
	for _, id := range m.Exclude {
		if id >= 0 && int(id) < len(row) {
			row[id] = negInf
		}
	}
	for _, v := range row {
		if v > negInf {
			return nil
		}
	}
	return ErrDeadEnd
}

// IDSet is an immutable set of token ids, as a bitset: bit id%64 of word
// id/64. Backends register it once (by pointer) and refer to it by index.
type IDSet struct{ bits []uint64 }

// NewIDSet returns the set of ids in [0, v) for which in is true.
func NewIDSet(v int, in func(id int32) bool) *IDSet {
	s := &IDSet{bits: make([]uint64, (v+63)/64)}
	for id := int32(0); int(id) < v; id++ {
		if in(id) {
			s.bits[id/64] |= 1 << (id % 64)
		}
	}
	return s
}

// Has reports whether id is in s.
func (s *IDSet) Has(id int32) bool {
	return id >= 0 && int(id/64) < len(s.bits) && s.bits[id/64]>>(id%64)&1 == 1
}

// Bits returns the bitset (shared: do not modify).
func (s *IDSet) Bits() []uint64 { return s.bits }

// Uniform takes the sampler's next random number in [0, 1): the U of a
// draw made elsewhere (forward.Draw), one per draw at Temperature > 0, so
// that a seeded sample's stream advances as its host draws would.
func (s *Sampler) Uniform() float64 { return s.float64() }

// Force leaves only id allowed in row: ErrDeadEnd (row untouched) if id is
// outside the row or its entry is -Inf or NaN, else every other entry
// becomes -Inf. It is what the Forcer contract calls "force id".
func Force(row []float32, id int32) error {
	if id < 0 || int(id) >= len(row) {
		return ErrDeadEnd
	}
	v := row[id]
	if !(v > float32(math.Inf(-1))) { // -Inf or NaN
		return ErrDeadEnd
	}
	FillNegInf(row)
	row[id] = v
	return nil
}

// FillNegInf sets every entry of s to -Inf: one store, then copies of the
// filled prefix doubling in size (copy is a vectorised memmove, several
// times faster than a store per entry over a vocabulary-sized row).
func FillNegInf(s []float32) {
	if len(s) == 0 {
		return
	}
	s[0] = float32(math.Inf(-1))
	for n := 1; n < len(s); n *= 2 {
		copy(s[n:], s[:n])
	}
}
