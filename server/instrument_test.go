package server

import (
	"slices"
	"testing"

	"chunlian/engine"
)

// keeperEngine is an engine.Engine that keeps samples: it records what
// Release is given.
type keeperEngine struct {
	engine.Engine
	released []engine.Handle
}

func (k *keeperEngine) Release(hs ...engine.Handle) { k.released = append(k.released, hs...) }

type plainEngine struct{ engine.Engine }

// TestInstrumentEngineKeeps: the metrics decorator is an engine.Keeper
// exactly when the engine it wraps is one, and forwards Release to it (the
// couplet generator keeps samples only through a Keeper, and the server
// hands it decorated engines).
func TestInstrumentEngineKeeps(t *testing.T) {
	var m Metrics
	k := &keeperEngine{}
	w, ok := m.InstrumentEngine(k).(engine.Keeper)
	if !ok {
		t.Fatal("the decorated Keeper is not an engine.Keeper")
	}
	w.Release(3, 5)
	if !slices.Equal(k.released, []engine.Handle{3, 5}) {
		t.Errorf("released %v, want [3 5]", k.released)
	}
	if _, ok := m.InstrumentEngine(plainEngine{}).(engine.Keeper); ok {
		t.Error("the decorated plain engine claims to keep samples")
	}
}
