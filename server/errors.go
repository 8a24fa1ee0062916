package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"chunlian/couplet"
	"chunlian/engine"
)

// apiError is the body of every error response, in OpenAI's shape:
// {"error":{"message","type","param","code"}}. Message is bilingual:
// Chinese first, then " / " and English. Type is OpenAI's error class,
// derived from the status when not set; Param names the offending request
// field, or is null.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
	// RetryAfter, when > 0, is sent as a Retry-After header (seconds).
	RetryAfter int `json:"-"`
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func errf(status int, code, zh, en string, args ...any) *apiError {
	return &apiError{Status: status, Code: code, Message: fmt.Sprintf(zh+" / "+en, args...)}
}

// Error codes (stable; documented in docs/API.md).
const (
	codeInvalidJSON     = "invalid_json"
	codeInvalidUTF8     = "invalid_utf8"
	codeInvalidField    = "invalid_field"
	codeUnknownField    = "unknown_field"
	codeInvalidPrompt   = "invalid_prompt"
	codeBodyTooLarge    = "body_too_large"
	codeMethod          = "method_not_allowed"
	codeNotFound        = "not_found"
	codeUnauthorized    = "unauthorized"
	codeOverloaded      = "overloaded"
	codeQueueFull       = "queue_full"
	codeNotReady        = "not_ready"
	codeShuttingDown    = "shutting_down"
	codeTimeout         = "timeout"
	codeTooLong         = "too_long"
	codeClientClosed    = "client_closed"
	codeInternal        = "internal"
	codeNoCouplet       = "no_couplet"
	codeUnsupportedType = "unsupported_media_type"
	codeBodyTimeout     = "request_timeout"
	codeModelNotFound   = "model_not_found"
	codeUnsupported     = "unsupported_parameter"
)

// writeJSON writes v with status; encoding errors can only be I/O errors of
// a gone client, so they are ignored.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// errorType is OpenAI's error type for a status (the Python SDK maps
// statuses to exception classes; the type string is informational).
func errorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return "overloaded_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// withParam returns e naming the request field it is about.
func (e *apiError) withParam(p string) *apiError {
	e.Param = &p
	return e
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.Type == "" {
		e.Type = errorType(e.Status)
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(e.RetryAfter))
	}
	writeJSON(w, e.Status, map[string]*apiError{"error": e})
}

// mapGenError turns a generator/engine error into an API error. timeout is
// the configured request timeout (for the message).
func mapGenError(err error, timeout time.Duration) *apiError {
	var ie *couplet.InputError
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &ie):
		return &apiError{Status: http.StatusBadRequest, Code: ie.Code, Message: ie.Message, Param: inputParam(ie.Code)}
	case errors.Is(err, engine.ErrQueueFull):
		e := errf(http.StatusServiceUnavailable, codeQueueFull, "服务繁忙，排队已满，请稍后重试", "server busy: the request queue is full, retry later")
		e.RetryAfter = 1
		return e
	case errors.Is(err, engine.ErrTooLong):
		// Only reachable with a model or KV cache smaller than a couplet
		// needs (--kv-cache-memory too small): the request cannot fit.
		return errf(http.StatusBadRequest, codeTooLong, "请求超出模型或缓存容量：%v", "request does not fit the model or KV cache: %v", err, err)
	case errors.Is(err, engine.ErrClosed):
		e := errf(http.StatusServiceUnavailable, codeShuttingDown, "服务正在关闭", "server is shutting down")
		e.RetryAfter = 5
		return e
	case errors.Is(err, context.DeadlineExceeded):
		return errf(http.StatusGatewayTimeout, codeTimeout, "生成超时（超过 %v）", "generation timed out after %v (--request-timeout)", timeout, timeout)
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads this, but it is logged and counted.
		return errf(499, codeClientClosed, "客户端已断开", "client closed the request")
	default:
		return errf(http.StatusInternalServerError, codeInternal, "内部错误：%v", "internal error: %v", err, err)
	}
}

// inputParam names the request field a generator input error is about.
func inputParam(code string) *string {
	switch code {
	case couplet.CodeBadLength:
		return strPtr("length")
	case couplet.CodeBadN:
		return strPtr("n")
	case couplet.CodeBadMode:
		return strPtr("mode")
	case couplet.CodeBadSampling:
		return nil // temperature, top_p or top_k: the message says which
	}
	return strPtr("prompt")
}
