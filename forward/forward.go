// Package forward runs the transformer over one flat batch of tokens drawn
// from many sequences (prefill chunks and decode tokens mixed), writing each
// token's K/V into a paged KV cache and reading attention through per-sequence
// block tables, in the manner of vLLM's PagedAttention.
//
// The block manager (package kvcache) decides which physical block holds which
// tokens; this package owns the cache memory itself and only ever touches the
// slots it is told to.
package forward

// SeqSpan describes one sequence's slice of a flat batch.
type SeqSpan struct {
	Start int // index of the sequence's first token in Batch.Tokens
	Len   int // number of tokens of this sequence in the batch (≥1)
	// CtxLen is the sequence's context length after this step: the tokens
	// already in the cache plus these Len new ones. The new tokens sit at
	// positions CtxLen-Len .. CtxLen-1.
	CtxLen int
	// BlockTable lists the physical KV blocks of the sequence in logical
	// order; it covers at least CtxLen tokens.
	BlockTable []int32
}

// Batch is one step's work. Tokens of a sequence are contiguous.
type Batch struct {
	Tokens    []int32 // [T] token ids
	Positions []int32 // [T] position of each token in its sequence
	// SlotMapping gives, per token, the cache slot its K/V is written to:
	// block*BlockSize + offset. Its length is T.
	SlotMapping []int32 // [T]
	Seqs        []SeqSpan
	// LogitRows are indices into Tokens whose logits are wanted (usually the
	// last token of each sequence that will sample). Logits for other tokens
	// are never computed.
	LogitRows []int
}

// Backend is a forward pass implementation together with the KV cache memory
// it owns. A Backend is used by one goroutine at a time (the engine loop).
type Backend interface {
	// Forward runs the model over b and writes len(b.LogitRows) rows of
	// vocab-size logits into logits (row i belongs to b.LogitRows[i]).
	Forward(b *Batch, logits []float32) error
	// CopyBlocks copies the first slots[i] slots (1..BlockSize) of KV block
	// src[i] into block dst[i] in every layer (copy-on-write of a shared
	// partial block: only the slots holding tokens); dst's later slots are
	// left as they were.
	CopyBlocks(src, dst, slots []int32) error
	// NumBlocks and BlockSize describe the paged cache the backend allocated.
	NumBlocks() int
	BlockSize() int
	VocabSize() int
	// Close frees the cache and any device memory.
	Close() error
}

// RowLSEBackend is an optional Backend extension: a backend that computes,
// where the logits are (on the GPU for cuda.Backend), log Σ exp of every
// logits row spares the engine a pass over each row on the host.
// LogSumExp returns, after a Forward, one value per row of that Forward's
// LogitRows (row i's log-probability of token t is logits[i·V+t] −
// LogSumExp()[i]), or nil when it did not compute them; the slice is valid
// until the next Forward. Callers must check its length.
type RowLSEBackend interface {
	LogSumExp() []float32
}

// Draw asks a DrawBackend for one token of one logits row, chosen where the
// logits are (on the GPU for cuda.Backend), so that the row itself never
// crosses to the host: a step of 2,000 rows × 6,189 logits is 50 MB of
// copies and as many host passes otherwise.
//
// The draw is sampler.DrawRow's algorithm (package sampler has the Go
// reference and its exact definition): mask, temperature, the top-k/top-p
// nucleus in sorted order (ties by lower id), min-p, then a draw with U.
// Every backend implements the same definition; tokens may still differ
// between backends where float rounding moves a boundary.
type Draw struct {
	Row int32 // index into Batch.LogitRows
	// Force ≥ 0: nothing is drawn; the result is Force with its raw logit
	// (a forced token, or a prompt position scored for its log-prob).
	// Force must be < the vocabulary size.
	Force int32
	// Mask is a set of allowed tokens from RegisterMask; -1 = every token.
	Mask int32
	// Exclude lists further forbidden tokens (ids outside the vocabulary
	// are ignored).
	Exclude []int32
	// Temperature 0 = greedy (the lowest id of the maximum). TopK ≤ 0,
	// TopP ≤ 0 or ≥ 1 and MinP ≤ 0 are off, as in sampler.Params.
	Temperature, TopP, MinP float32
	TopK                    int32
	U                       float64 // the draw's uniform number in [0, 1); unused when greedy
}

// Drawn is one Draw's result.
type Drawn struct {
	Tok   int32   // drawn (or forced) token; -1: the mask left no token (dead end)
	Logit float32 // raw logits[Row, Tok], before masking (NaN or -Inf possible for a forced token)
}

// MaxDrawExclude bounds len(Draw.Exclude); longer lists go the host way.
const MaxDrawExclude = 32

// DrawBackend is an optional Backend extension: a backend that draws
// tokens where the logits are. The engine uses it for every sampled row
// whose logits processor can describe itself as a mask (sampler.Masker)
// and for prompt log-prob rows (a Force draw), and asks for whole rows
// only where something on the host must read them (hostRows).
type DrawBackend interface {
	Backend
	RowLSEBackend
	// DrawVocab reports whether draws work for this model (a backend may
	// limit the vocabulary size, e.g. to what fits in shared memory);
	// false means: call Forward as usual.
	DrawVocab() bool
	// RegisterMask stores a set of allowed tokens on the backend and
	// returns its index for Draw.Mask: bit t%64 of allowed[t/64] allows
	// token t; tokens ≥ 64·len(allowed) are not allowed. Indices are small
	// and stable for the backend's life; a backend may refuse more than a
	// few dozen sets (error), after which the caller uses the host way.
	RegisterMask(allowed []uint64) (int32, error)
	// ForwardDraw is Forward over b, then out[i] = the result of draws[i]
	// (len(out) == len(draws)), and logits receives only the rows that
	// hostRows lists: hostRows[k] (an index into b.LogitRows) into
	// logits[k·V:(k+1)·V]. LogSumExp covers every row of b.LogitRows.
	ForwardDraw(b *Batch, draws []Draw, out []Drawn, hostRows []int32, logits []float32) error
}

// AsyncDrawBackend is an optional DrawBackend extension: ForwardDraw split
// in two, so that the host can consume one step's results and schedule
// the next while the device computes (two steps in flight, on alternating
// slots). Work runs in launch order.
type AsyncDrawBackend interface {
	DrawBackend
	// LaunchDraw starts ForwardDraw's work on slot (0 or 1) and returns
	// without waiting for it. The work may still read b, draws, hostRows
	// and the block tables b.Seqs refer to after it returns: the caller
	// leaves them unchanged until WaitDraw(slot) returns. A slot holds at
	// most one launch until its WaitDraw. CopyBlocks and RegisterMask
	// calls made between a launch and its wait run after the launched
	// work. An error here means nothing was launched (a bad or busy slot);
	// the launch's own errors may come back from WaitDraw instead.
	LaunchDraw(slot int, b *Batch, draws []Draw, hostRows []int32) error
	// WaitDraw waits for slot's launch and writes its results: out
	// [len(draws)], logits [len(hostRows)·V] and lse [len(b.LogitRows)]
	// (log-sum-exp per logits row, as LogSumExp). After an error other
	// than a wrong slice length the slot is free again.
	WaitDraw(slot int, out []Drawn, logits []float32, lse []float32) error
}
