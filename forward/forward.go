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
	// CopyBlocks copies whole KV blocks src[i] → dst[i] in every layer
	// (copy-on-write of a shared partial block).
	CopyBlocks(src, dst []int32) error
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
