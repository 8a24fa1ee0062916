package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"chunlian/engine"
)

// Every engine/context error the generator can return maps to its own
// status and code, also when wrapped.
func TestMapGenError(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("gen: %w", engine.ErrQueueFull), http.StatusServiceUnavailable, codeQueueFull},
		{fmt.Errorf("gen: %w", engine.ErrClosed), http.StatusServiceUnavailable, codeShuttingDown},
		{fmt.Errorf("%w: prompt 90 + max_tokens 40 > 128 positions", engine.ErrTooLong), http.StatusBadRequest, codeTooLong},
		{context.DeadlineExceeded, http.StatusGatewayTimeout, codeTimeout},
		{context.Canceled, 499, codeClientClosed},
		{errors.New("boom"), http.StatusInternalServerError, codeInternal},
	} {
		e := mapGenError(tc.err, time.Second)
		if e.Status != tc.status || e.Code != tc.code {
			t.Errorf("%v: got %d %s, want %d %s", tc.err, e.Status, e.Code, tc.status, tc.code)
		}
		if e.Message == "" {
			t.Errorf("%v: empty message", tc.err)
		}
	}
}
