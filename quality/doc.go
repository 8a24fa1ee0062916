// Package quality measures the couplet model as docs/EVAL.md defines it,
// with the Go forward pass: corpus BLEU over characters (BLEU), greedy
// lower-mode decoding with the 下联's length forced (LowerGreedy) and the
// teacher-forced 下联 perplexity (LowerNLL), on held-out pairs read by
// ReadPairs. The figures equal the PyTorch side's (training/evaluate.py)
// on the shipped model; TestShippedModelMatchesEvalJSON keeps them so.
//
// Each function runs on a CPU backend of its own, never on an engine's
// backend, which belongs to the engine goroutine.
//
// RunEval is `chunlian eval`'s constraint evaluation on a couplet
// generator: rule pass rates, keyword inclusion and latency with the
// constraints on and off, and the figures above (EvalReport.WriteMarkdown
// prints docs/EVAL.md's section "Constrained decoding (Go engine)").
//
// It also holds the reader's instruments (docs/EVAL.md, "Reading as a
// reader does"): the blind reading kit (WriteBlindSheet, ScoreSheet,
// Wilson) and the automatic signals of chunlian's couplets against human
// ones of the same words (ComputeSignals, with package critic's scores).
package quality
