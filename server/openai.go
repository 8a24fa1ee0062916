package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"chunlian/couplet"
)

// OpenAI-compatible endpoints. The prompt (or the last user message) is the
// blessing word (two Chinese characters → keyword mode) or a 上联 (anything
// longer → lower mode); the optional extension field "mode" overrides that.
// Unknown fields are ignored (clients send many: logprobs, stop, user, …) so
// existing SDKs and load tools work; known fields are type-checked.
// max_tokens is accepted and ignored: the couplet's form fixes its length.

type completionRequest struct {
	Model       string          `json:"model"`
	Prompt      json.RawMessage `json:"prompt"` // string or [string] (first used)
	MaxTokens   *int            `json:"max_tokens"`
	Temperature *float64        `json:"temperature"`
	TopP        *float64        `json:"top_p"`
	TopK        *int            `json:"top_k"` // vLLM extension
	N           *int            `json:"n"`
	Seed        *uint64         `json:"seed"`
	Stream      bool            `json:"stream"`
	Mode        string          `json:"mode"`   // chunlian extension
	Length      *int            `json:"length"` // chunlian extension
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // string or [{type:"text",text}]
}

type chatRequest struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	MaxTokens   *int          `json:"max_tokens"`
	MaxCompl    *int          `json:"max_completion_tokens"`
	Temperature *float64      `json:"temperature"`
	TopP        *float64      `json:"top_p"`
	TopK        *int          `json:"top_k"`
	N           *int          `json:"n"`
	Seed        *uint64       `json:"seed"`
	Stream      bool          `json:"stream"`
	Mode        string        `json:"mode"`
	Length      *int          `json:"length"`
}

// promptString decodes an OpenAI prompt: a string or an array of strings
// (only one prompt per request is supported).
func promptString(raw json.RawMessage) (string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var arr []string
	if err := json.Unmarshal(raw, &arr); err == nil {
		if len(arr) != 1 {
			return "", errf(http.StatusBadRequest, codeInvalidField, "prompt 数组只能包含一个字符串", "prompt arrays must hold exactly one string (got %d)", len(arr))
		}
		return arr[0], nil
	}
	return "", errf(http.StatusBadRequest, codeInvalidField, "字段 \"prompt\" 须为字符串", "field \"prompt\" must be a string or an array of one string")
}

// messageText decodes chat content: a string or text parts.
func messageText(raw json.RawMessage) (string, *apiError) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err == nil {
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
		return b.String(), nil
	}
	return "", errf(http.StatusBadRequest, codeInvalidField, "消息 content 须为字符串", "message content must be a string or an array of text parts")
}

// autoMode picks keyword for a two-character prompt, lower otherwise.
func autoMode(mode, prompt string) couplet.Mode {
	if mode != "" {
		return couplet.Mode(mode)
	}
	if utf8.RuneCountInString(strings.TrimSpace(prompt)) <= 2 {
		return couplet.ModeKeyword
	}
	return couplet.ModeLower
}

func (s *Server) modelName(b *Backend) string {
	if b != nil && b.ModelName != "" {
		return b.ModelName
	}
	return "chunlian"
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	b := s.backend.Load()
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": s.modelName(b), "object": "model", "created": s.started.Unix(), "owned_by": "chunlian",
			"max_model_len": maxPromptRune,
		}},
	})
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var body completionRequest
	if e := s.readJSON(w, r, &body, false); e != nil {
		writeError(w, e)
		return
	}
	prompt, e := promptString(body.Prompt)
	if e != nil {
		writeError(w, e)
		return
	}
	s.openAI(w, r, false, prompt, body.Mode, body.N, body.Length, body.Temperature, body.TopP, body.TopK, body.Seed, body.Stream)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	var body chatRequest
	if e := s.readJSON(w, r, &body, false); e != nil {
		writeError(w, e)
		return
	}
	prompt := ""
	found := false
	for i := len(body.Messages) - 1; i >= 0; i-- {
		if body.Messages[i].Role == "user" {
			t, e := messageText(body.Messages[i].Content)
			if e != nil {
				writeError(w, e)
				return
			}
			prompt, found = t, true
			break
		}
	}
	if !found {
		writeError(w, errf(http.StatusBadRequest, codeInvalidPrompt, "messages 中需要一条 user 消息（吉祥词或上联）", "messages must contain a user message (the blessing word or 上联)"))
		return
	}
	s.openAI(w, r, true, prompt, body.Mode, body.N, body.Length, body.Temperature, body.TopP, body.TopK, body.Seed, body.Stream)
}

// openAI runs a completion or chat completion and answers in OpenAI's shape.
func (s *Server) openAI(w http.ResponseWriter, r *http.Request, chat bool, prompt, mode string, n, length *int,
	temp, topP *float64, topK *int, seed *uint64, stream bool) {
	p := genParams{Prompt: prompt, Mode: autoMode(mode, prompt), N: 1, Temperature: temp, TopP: topP, TopK: topK, Seed: seed}
	if n != nil {
		p.N = *n
	}
	if length != nil {
		p.Length = *length
	}
	req, b, release, ok := s.admit(w, &p)
	if !ok {
		return
	}
	defer release()
	id := "cmpl-" + requestID(r.Context())
	object := "text_completion"
	if chat {
		id = "chatcmpl-" + requestID(r.Context())
		object = "chat.completion"
	}
	created := time.Now().Unix()
	model := s.modelName(b)

	if !stream {
		res, e := s.run(r.Context(), b, req)
		if e != nil {
			writeError(w, e)
			return
		}
		choices := make([]map[string]any, len(res.couplets))
		for i, c := range res.couplets {
			if chat {
				choices[i] = map[string]any{"index": i, "message": map[string]string{"role": "assistant", "content": c.Text()}, "finish_reason": "stop"}
			} else {
				choices[i] = map[string]any{"index": i, "text": c.Text(), "logprobs": nil, "finish_reason": "stop"}
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": object, "created": created, "model": model,
			"choices": choices, "usage": res.usage, "couplets": res.couplets,
		})
		return
	}

	// Streaming: the couplet is ranked only after all candidates finish, so
	// the text arrives after generation, one chunk per line (上联, 下联, 横批)
	// per choice; the last chunk carries finish_reason and usage; then
	// "data: [DONE]". Errors after the headers are sent as a data chunk
	// {"error":{…}} followed by [DONE].
	if chat {
		object = "chat.completion.chunk"
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	send := func(v any) {
		js, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", js)
		flush()
	}
	chunk := func(choices []map[string]any, usage any) map[string]any {
		m := map[string]any{"id": id, "object": object, "created": created, "model": model, "choices": choices}
		if usage != nil {
			m["usage"] = usage
		}
		return m
	}
	if chat { // role first, as OpenAI does
		send(chunk([]map[string]any{{"index": 0, "delta": map[string]string{"role": "assistant"}, "finish_reason": nil}}, nil))
	}
	res, e := s.run(r.Context(), b, req)
	if e != nil {
		send(map[string]*apiError{"error": e})
		fmt.Fprint(w, "data: [DONE]\n\n")
		flush()
		return
	}
	for i, c := range res.couplets {
		lines := strings.SplitAfter(c.Text(), "\n")
		for j, line := range lines {
			last := i == len(res.couplets)-1 && j == len(lines)-1
			var fin any
			if j == len(lines)-1 {
				fin = "stop"
			}
			ch := map[string]any{"index": i, "finish_reason": fin}
			if chat {
				if j == 0 && i > 0 {
					ch["delta"] = map[string]string{"role": "assistant", "content": line}
				} else {
					ch["delta"] = map[string]string{"content": line}
				}
			} else {
				ch["text"] = line
				ch["logprobs"] = nil
			}
			var u any
			if last {
				u = res.usage
			}
			send(chunk([]map[string]any{ch}, u))
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	flush()
}
