package couplet

import (
	"context"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"sync"

	"chunlian/engine"
	"chunlian/sampler"
)

// fakeEngine is a stand-in engine.Engine for unit tests: its "model" gives
// every context a deterministic pseudo-random logits row (a hash of the
// tokens seeds a PCG), so outputs are reproducible and arbitrary — exactly
// what the constraints must cope with. It runs samples one after another on
// the calling goroutine and counts calls (guarded by mu).
type fakeEngine struct {
	vocab int
	// extra, if set, runs after the request's own processor (to make
	// constraints impossible in tests).
	extra sampler.LogitsProcessor

	mu                   sync.Mutex
	genCalls, scoreCalls int
	bannerCalls          int // the genCalls of 横批 requests (4 tokens)
}

func (f *fakeEngine) row(ctx []int32) []float32 {
	h := fnv.New64a()
	for _, t := range ctx {
		h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
	}
	r := rand.New(rand.NewPCG(h.Sum64(), 7))
	row := make([]float32, f.vocab) // [vocab]
	for i := range row {
		row[i] = float32(r.NormFloat64() * 3)
	}
	return row
}

type chain []sampler.LogitsProcessor

func (c chain) Process(g []int32, l []float32) error {
	for _, p := range c {
		if p == nil {
			continue
		}
		if err := p.Process(g, l); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeEngine) Generate(ctx context.Context, req *engine.Request) (*engine.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	if req.Params.MaxTokens == 0 {
		f.scoreCalls++
	} else {
		f.genCalls++
		if req.Params.MaxTokens == 4 {
			f.bannerCalls++
		}
	}
	f.mu.Unlock()
	res := &engine.Result{PromptTokens: len(req.Prompt)}
	if req.PromptLogProbs {
		for i := 1; i < len(req.Prompt); i++ {
			res.PromptLogProbs = append(res.PromptLogProbs, sampler.LogProb(f.row(req.Prompt[:i]), req.Prompt[i]))
		}
	}
	if req.Params.MaxTokens == 0 {
		return res, nil
	}
	n := max(req.Params.N, 1)
	for i := 0; i < n; i++ {
		s := sampler.New(req.Params, i)
		var proc sampler.LogitsProcessor
		if req.NewProcessor != nil {
			proc = req.NewProcessor(i)
		}
		if f.extra != nil {
			proc = chain{proc, f.extra}
		}
		comp := engine.Completion{Index: i, Finish: engine.FinishLength}
		for len(comp.Tokens) < req.Params.MaxTokens {
			ctxToks := append(append([]int32(nil), req.Prompt...), comp.Tokens...)
			tok, lp, err := s.Sample(f.row(ctxToks), req.Prompt, comp.Tokens, proc)
			if errors.Is(err, sampler.ErrDeadEnd) {
				comp.Finish = engine.FinishDeadEnd
				break
			}
			if err != nil {
				return nil, err
			}
			comp.Tokens = append(comp.Tokens, tok)
			comp.LogProbs = append(comp.LogProbs, lp)
			if req.OnEvent != nil {
				req.OnEvent(engine.Event{Index: i, Token: tok})
			}
			stop := false
			for _, st := range req.Params.StopTokens {
				stop = stop || st == tok
			}
			if stop {
				comp.Finish = engine.FinishStop
				break
			}
		}
		if req.OnEvent != nil {
			req.OnEvent(engine.Event{Index: i, Token: -1, Done: true, Finish: comp.Finish})
		}
		res.Completions = append(res.Completions, comp)
	}
	return res, nil
}

func (f *fakeEngine) Stats() engine.Stats { return engine.Stats{} }
func (f *fakeEngine) Close() error        { return nil }
