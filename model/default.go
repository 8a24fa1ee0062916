package model

import "errors"

// Default loads the model embedded in the binary (package chunlian/weights).
// Until the training helper commits weights/weights.go it reports that the
// default model is not built yet.
func Default() (*Model, error) {
	return nil, ErrNoDefault
}

// ErrNoDefault is returned by Default when the binary embeds no model.
var ErrNoDefault = errors.New("model: default model not built yet (weights/chunlian-base missing); use --model DIR")
