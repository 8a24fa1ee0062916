package couplet

import (
	"sync"
	"time"

	"chunlian/engine"
)

// stageTimer measures one stage of Generate into a Trace. All methods are
// no-ops on a nil *stageTimer (no trace asked for), so Generate calls them
// unconditionally. addResult may be called from several goroutines (the
// banner stage scores couplets concurrently); mu guards st.
type stageTimer struct {
	tr     *Trace
	e      engine.Engine
	t0     time.Time
	steps0 int64

	mu sync.Mutex
	st StageTrace
}

// startStage begins stage name of tr; nil tr gives a nil timer.
func startStage(tr *Trace, e engine.Engine, name string) *stageTimer {
	if tr == nil {
		return nil
	}
	return &stageTimer{tr: tr, e: e, t0: time.Now(), steps0: e.Stats().Steps, st: StageTrace{Name: name}}
}

// addResult counts one finished engine request of the stage.
func (s *stageTimer) addResult(res *engine.Result) {
	if s == nil || res == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.EngineRequests++
	s.st.PromptTokens += res.PromptTokens
	s.st.CachedTokens += res.CachedTokens
	s.st.ComputedTokens += res.ComputedTokens
	for _, c := range res.Completions {
		s.st.GenTokens += len(c.Tokens)
	}
}

// end closes the stage and appends it to the trace.
func (s *stageTimer) end() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Wall = time.Since(s.t0)
	s.st.EngineSteps = s.e.Stats().Steps - s.steps0
	s.tr.Stages = append(s.tr.Stages, s.st)
}
