package model

import (
	"errors"
	"sync"

	"chunlian/weights"
)

// Default loads the model embedded in the binary (package chunlian/weights,
// directory weights.DefaultDir). The model is immutable, so it is loaded and
// converted to float32 once per process and shared by every caller.
func Default() (*Model, error) {
	return loadDefault()
}

var loadDefault = sync.OnceValues(loadDefaultUncached)

func loadDefaultUncached() (*Model, error) { return LoadFS(weights.FS, weights.DefaultDir) }

// ErrNoDefault is returned by Default when the binary embeds no model. The
// current build embeds one, so it is only kept for callers that test for it.
var ErrNoDefault = errors.New("model: default model not built yet (weights/chunlian-base missing); use --model DIR")
