package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"chunlian/couplet"
)

// OpenAI-compatible endpoints. The prompt of /v1/completions is the
// blessing word (two Chinese characters → keyword mode) or a 上联 (anything
// longer → lower mode); /v1/chat/completions also reads natural language
// (see chatIntent). The extension field "mode" overrides both. Unknown
// fields are ignored (SDKs send many: user, presence_penalty, …) so existing
// clients work; known fields are type-checked, and those that would change
// the answer but are not implemented (stop, logprobs, top_logprobs, echo,
// suffix, best_of > 1) are rejected with 400 rather than silently ignored.
// max_tokens is accepted and ignored: the couplet's form fixes its length.
// An unknown "model" is 404 model_not_found, as vLLM answers.

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
	unsupported
	Echo   *bool   `json:"echo"`
	Suffix *string `json:"suffix"`
	BestOf *int    `json:"best_of"`
}

// unsupported holds the OpenAI fields that would change the answer and
// are not implemented; reject reports the first one set.
type unsupported struct {
	Stop        json.RawMessage `json:"stop"`
	Logprobs    json.RawMessage `json:"logprobs"` // completions: integer; chat: boolean
	TopLogprobs *int            `json:"top_logprobs"`
}

// set reports whether a raw JSON value is given and not a "nothing" value
// (null, false, "", [], 0 is not nothing for logprobs).
func set(raw json.RawMessage) bool {
	switch strings.TrimSpace(string(raw)) {
	case "", "null", "false", `""`, "[]":
		return false
	}
	return true
}

func (u unsupported) reject() *apiError {
	switch {
	case set(u.Stop):
		return errf(http.StatusBadRequest, codeUnsupported, "不支持 stop：春联的格式决定了在哪里结束", "stop is not supported: the couplet's form fixes where the text ends").withParam("stop")
	case set(u.Logprobs):
		return errf(http.StatusBadRequest, codeUnsupported, "不支持 logprobs", "logprobs is not supported").withParam("logprobs")
	case u.TopLogprobs != nil:
		return errf(http.StatusBadRequest, codeUnsupported, "不支持 top_logprobs", "top_logprobs is not supported").withParam("top_logprobs")
	}
	return nil
}

func (c *completionRequest) reject() *apiError {
	switch {
	case c.Echo != nil && *c.Echo:
		return errf(http.StatusBadRequest, codeUnsupported, "不支持 echo", "echo is not supported").withParam("echo")
	case c.Suffix != nil && *c.Suffix != "":
		return errf(http.StatusBadRequest, codeUnsupported, "不支持 suffix", "suffix is not supported").withParam("suffix")
	case c.BestOf != nil && *c.BestOf > 1:
		return errf(http.StatusBadRequest, codeUnsupported, "不支持 best_of（请用 n）", "best_of is not supported (use n: candidates are ranked already)").withParam("best_of")
	}
	return c.unsupported.reject()
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
	unsupported
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

// autoMode picks keyword for a blessing word (one, two or four Chinese
// characters: 福, 平安, 万事如意), lower otherwise, on the normalised prompt
// (so a zero-width character does not turn 平安 into a 上联).
func autoMode(mode, prompt string) couplet.Mode {
	if mode != "" {
		return couplet.Mode(mode)
	}
	p := couplet.Normalize(prompt)
	if n := utf8.RuneCountInString(p); n <= 2 || (n == 4 && isHanString(p)) {
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

// maxModelLen is the model's context length (max_position_embeddings),
// as vLLM reports it; 0 when the backend does not say.
func maxModelLen(b *Backend) int {
	if b != nil {
		return b.MaxModelLen
	}
	return 0
}

func (s *Server) modelObject(b *Backend) map[string]any {
	m := map[string]any{"id": s.modelName(b), "object": "model", "created": s.started.Unix(), "owned_by": "chunlian"}
	if n := maxModelLen(b); n > 0 {
		m["max_model_len"] = n
	}
	return m
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{s.modelObject(s.backend.Load())}})
}

// handleModel is GET /v1/models/{id}.
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	b := s.backend.Load()
	if e := s.checkModel(b, r.PathValue("id")); e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject(b))
}

// checkModel accepts the served model's name (or none, for curl users) and
// answers anything else with 404 model_not_found, as vLLM does.
func (s *Server) checkModel(b *Backend, name string) *apiError {
	if name == "" || name == s.modelName(b) {
		return nil
	}
	return errf(http.StatusNotFound, codeModelNotFound, "模型 %q 不存在（可用：%s）", "the model %q does not exist (served: %s)", name, s.modelName(b), name, s.modelName(b)).withParam("model")
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var body completionRequest
	if e := s.readJSON(w, r, &body, false); e != nil {
		writeError(w, e)
		return
	}
	prompt, e := promptString(body.Prompt)
	if e == nil {
		e = body.reject()
	}
	if e == nil {
		e = s.checkModel(s.backend.Load(), body.Model)
	}
	if e != nil {
		writeError(w, e)
		return
	}
	p := genParams{Prompt: prompt, Mode: autoMode(body.Mode, prompt), N: 1, Temperature: body.Temperature, TopP: body.TopP, TopK: body.TopK, Seed: body.Seed}
	s.openAI(w, r, false, p, body.N, body.Length, body.Stream)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	var body chatRequest
	if e := s.readJSON(w, r, &body, false); e != nil {
		writeError(w, e)
		return
	}
	e := body.reject()
	if e == nil {
		e = s.checkModel(s.backend.Load(), body.Model)
	}
	if e != nil {
		writeError(w, e)
		return
	}
	prompt := ""
	found := false
	for i := len(body.Messages) - 1; i >= 0; i-- {
		if body.Messages[i].Role == "user" {
			t, e := messageText(body.Messages[i].Content)
			if e != nil {
				writeError(w, e.withParam("messages"))
				return
			}
			prompt, found = t, true
			break
		}
	}
	if !found {
		writeError(w, errf(http.StatusBadRequest, codeInvalidPrompt, "messages 中需要一条 user 消息（吉祥词或上联）", "messages must contain a user message (the blessing word or 上联)").withParam("messages"))
		return
	}
	mode, prompt, e := chatIntent(couplet.Normalize(prompt), body.Mode)
	if e != nil {
		writeError(w, e)
		return
	}
	p := genParams{Prompt: prompt, Mode: mode, N: 1, Temperature: body.Temperature, TopP: body.TopP, TopK: body.TopK, Seed: body.Seed}
	s.openAI(w, r, true, p, body.N, body.Length, body.Stream)
}

// openAI runs a completion or chat completion and answers in OpenAI's
// shape. Every check (the HTTP layer's and the generator's) runs in admit,
// before the first byte, so a streamed request with bad input gets the same
// 4xx as a plain one.
func (s *Server) openAI(w http.ResponseWriter, r *http.Request, chat bool, p genParams, n, length *int, stream bool) {
	if n != nil {
		p.N = *n
	}
	if length != nil {
		p.Length = *length
		if p.Length == 0 {
			p.Length = -1 // explicit 0 is out of range, not "default"
		}
	}
	req, b, release, ok := s.admit(r.Context(), w, &p)
	if !ok {
		return
	}
	defer release()
	o := oaResponse{id: "cmpl-" + requestID(r.Context()), object: "text_completion", chat: chat,
		created: time.Now().Unix(), model: s.modelName(b)}
	if chat {
		o.id, o.object = "chatcmpl-"+requestID(r.Context()), "chat.completion"
	}
	if stream {
		s.streamOpenAI(w, r, b, req, o)
		return
	}
	res, e := s.run(r.Context(), b, req)
	if e != nil {
		writeError(w, e)
		return
	}
	choices := make([]map[string]any, len(res.couplets))
	for i, c := range res.couplets {
		if chat {
			choices[i] = map[string]any{"index": i, "message": map[string]string{"role": "assistant", "content": c.Text()}, "logprobs": nil, "finish_reason": "stop"}
		} else {
			choices[i] = map[string]any{"index": i, "text": c.Text(), "logprobs": nil, "finish_reason": "stop"}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": o.id, "object": o.object, "created": o.created, "model": o.model,
		"choices": choices, "usage": res.usage, "couplets": res.couplets,
	})
}
