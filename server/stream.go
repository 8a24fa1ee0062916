package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"

	"chunlian/couplet"
)

// runStreaming runs req like run, calling onToken on the calling (handler)
// goroutine for every token the engine decodes, as it is decoded. The
// engine calls OnToken on its own goroutine and must not block, so tokens
// pass through a buffered channel and are dropped when it is full (they are
// progress only: the result carries the answer). A panic in the generation
// becomes a 500 error instead of killing the process (this goroutine is
// outside withRecover's reach).
func (s *Server) runStreaming(ctx context.Context, b *Backend, req couplet.Request, onToken func(couplet.TokenEvent)) (*genResult, *apiError) {
	toks := make(chan couplet.TokenEvent, 256)
	req.OnToken = func(ev couplet.TokenEvent) {
		select {
		case toks <- ev:
		default:
		}
	}
	done := make(chan struct{})
	var res *genResult
	var e *apiError
	go func() {
		defer close(done)
		defer func() {
			if v := recover(); v != nil {
				s.metrics.panics.Inc()
				s.log.Error("stream panic", "request_id", requestID(ctx), "panic", v, "stack", string(debug.Stack()))
				res, e = nil, errf(http.StatusInternalServerError, codeInternal, "内部错误", "internal server error")
			}
		}()
		res, e = s.run(ctx, b, req)
	}()
	for {
		select {
		case ev := <-toks:
			onToken(ev)
			continue
		case <-done:
		}
		break
	}
	for { // what is still buffered
		select {
		case ev := <-toks:
			onToken(ev)
			continue
		default:
		}
		break
	}
	return res, e
}

// oaResponse is the envelope of one OpenAI answer.
type oaResponse struct {
	id, object, model string
	created           int64
	chat              bool
}

// streamOpenAI answers a validated, admitted streaming request in OpenAI's
// SSE format. While the engine decodes, every token is sent at once as a
// chunk with an empty delta and the extension field "chunlian_token"
// ({attempt, sample, part, text}; clients that do not know it see an empty
// delta): the couplet is ranked only after all candidates finish, so the
// answer's text can only follow then, one chunk per line (上联, 下联, 横批)
// per choice; the last chunk carries finish_reason and usage; then
// "data: [DONE]". An error after the headers (timeout, overload inside the
// engine) is sent as a data chunk {"error":{…}} followed by [DONE].
func (s *Server) streamOpenAI(w http.ResponseWriter, r *http.Request, b *Backend, req couplet.Request, o oaResponse) {
	object := o.object
	if o.chat {
		object = "chat.completion.chunk"
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(v any) {
		js, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", js)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	chunk := func(choice map[string]any) map[string]any {
		return map[string]any{"id": o.id, "object": object, "created": o.created, "model": o.model, "choices": []map[string]any{choice}}
	}
	empty := func() map[string]any {
		if o.chat {
			return map[string]any{"index": 0, "delta": map[string]string{}, "logprobs": nil, "finish_reason": nil}
		}
		return map[string]any{"index": 0, "text": "", "logprobs": nil, "finish_reason": nil}
	}
	if o.chat { // role first, as OpenAI does
		send(chunk(map[string]any{"index": 0, "delta": map[string]string{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}))
	}
	res, e := s.runStreaming(r.Context(), b, req, func(ev couplet.TokenEvent) {
		c := chunk(empty())
		c["chunlian_token"] = tokenEventJSON{Attempt: ev.Attempt, Sample: ev.Sample, Part: string(ev.Part), Text: ev.Text}
		send(c)
	})
	if e != nil {
		if e.Type == "" {
			e.Type = errorType(e.Status)
		}
		send(map[string]*apiError{"error": e})
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	for i, c := range res.couplets {
		lines := strings.SplitAfter(c.Text(), "\n")
		for j, line := range lines {
			var fin any
			if j == len(lines)-1 {
				fin = "stop"
			}
			ch := map[string]any{"index": i, "logprobs": nil, "finish_reason": fin}
			if o.chat {
				if j == 0 && i > 0 {
					ch["delta"] = map[string]string{"role": "assistant", "content": line}
				} else {
					ch["delta"] = map[string]string{"content": line}
				}
			} else {
				ch["text"] = line
			}
			m := chunk(ch)
			if i == len(res.couplets)-1 && j == len(lines)-1 {
				m["usage"] = res.usage
			}
			send(m)
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}
