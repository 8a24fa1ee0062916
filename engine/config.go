package engine

import "fmt"

// Config tunes the continuous-batching engine.
//
// The zero Config means DefaultConfig(); in any other Config, zero numeric
// fields take their defaults but EnablePrefixCaching is taken as written
// (a bool cannot tell "unset" from false).
type Config struct {
	BlockSize           int  // tokens per KV block; 0 = the backend's; must equal it
	MaxNumSeqs          int  // sequences per step (default 256)
	MaxNumBatchedTokens int  // tokens per step, prefill chunks + decodes (default 2048)
	MaxQueue            int  // requests waiting for admission before ErrQueueFull (default 1024; not Request.FollowUp)
	EnablePrefixCaching bool // reuse cached full prompt blocks across requests (default true)
	// SamplingWorkers bounds the goroutines (the engine goroutine included)
	// that run each step's logits processors and samplers, one row each at
	// a time (default 0 = GOMAXPROCS; 1 = all on the engine goroutine).
	// Outputs do not depend on it.
	SamplingWorkers int
	// OverlapMinSeqs is the number of sequences (running + waiting) from
	// which two steps are kept in flight (default 128; see overlapRunner).
	OverlapMinSeqs int

	// noJump turns jump-forward off (tests compare the two paths).
	noJump bool
}

// DefaultConfig returns the defaults, prefix caching on.
func DefaultConfig() Config {
	return Config{MaxNumSeqs: 256, MaxNumBatchedTokens: 2048, MaxQueue: 1024, EnablePrefixCaching: true, OverlapMinSeqs: 128}
}

// withDefaults fills zero fields (see Config).
func (c Config) withDefaults(backendBlockSize int) Config {
	if c == (Config{}) {
		c = DefaultConfig()
	}
	d := DefaultConfig()
	if c.BlockSize == 0 {
		c.BlockSize = backendBlockSize
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = d.MaxNumSeqs
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = d.MaxNumBatchedTokens
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = d.MaxQueue
	}
	if c.OverlapMinSeqs == 0 {
		c.OverlapMinSeqs = d.OverlapMinSeqs
	}
	return c
}

// Validate reports settings the engine cannot run with. Zero fields are
// valid (they mean the default); New also checks BlockSize against the
// backend.
func (c Config) Validate() error {
	switch {
	case c.BlockSize < 0:
		return fmt.Errorf("engine: block size %d must be ≥ 0 (0 = the backend's)", c.BlockSize)
	case c.MaxNumSeqs < 0:
		return fmt.Errorf("engine: max-num-seqs %d must be ≥ 0 (0 = default)", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < 0:
		return fmt.Errorf("engine: max-num-batched-tokens %d must be ≥ 0 (0 = default)", c.MaxNumBatchedTokens)
	case c.MaxQueue < 0:
		return fmt.Errorf("engine: max queue %d must be ≥ 0 (0 = default)", c.MaxQueue)
	case c.OverlapMinSeqs < 0:
		return fmt.Errorf("engine: overlap min seqs %d must be ≥ 0 (0 = default)", c.OverlapMinSeqs)
	case c.SamplingWorkers < 0:
		return fmt.Errorf("engine: sampling workers %d must be ≥ 0 (0 = GOMAXPROCS)", c.SamplingWorkers)
	}
	return nil
}
