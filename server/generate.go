package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"chunlian/couplet"
)

// Limits checked by the HTTP layer before the generator sees a request:
// couplet.Limits, the table the command line shares (the generator
// validates again, with its own model-specific rules).
var (
	maxN          = couplet.Limits.MaxN
	minLineLength = couplet.Limits.MinLength
	maxLineLength = couplet.Limits.MaxLength
	maxPromptRune = couplet.Limits.MaxTextRunes
)

// bodyReadTimeout bounds reading a request body (a variable for tests).
var bodyReadTimeout = 30 * time.Second

// generateRequest is the body of POST /generate. Pointers distinguish "not
// given" from zero.
type generateRequest struct {
	Prompt      *string  `json:"prompt"`
	Mode        string   `json:"mode"`
	N           *int     `json:"n"`
	Length      *int     `json:"length"`
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	TopK        *int     `json:"top_k"`
	Seed        *uint64  `json:"seed"`
	Stream      bool     `json:"stream"`
}

// generateResponse is the answer of POST /generate (and the final "result"
// event of a stream). generated_text and prompt keep the seed service's
// shape; the rest is additive.
type generateResponse struct {
	GeneratedText string            `json:"generated_text"`
	Prompt        string            `json:"prompt"`
	Mode          string            `json:"mode"`
	Couplets      []couplet.Couplet `json:"couplets"`
	LatencyMS     float64           `json:"latency_ms"`
	Usage         usageJSON         `json:"usage"`
	RequestID     string            `json:"request_id"`
}

type usageJSON struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// readJSON reads a JSON request body into v: a JSON media type (415
// otherwise: text/plain and form bodies are what a foreign web page can
// send without a CORS preflight, so accepting them would let any page make
// a visitor's local server generate), bounded by MaxBodyBytes (413, at once
// from the Content-Length when it is declared, so an "Expect:
// 100-continue" client is refused before it sends the body), read within
// bodyReadTimeout (408), valid UTF-8, exactly one value, and (when strict)
// no unknown fields. Errors are bilingual API errors without internal
// details.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any, strict bool) *apiError {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return errf(http.StatusUnsupportedMediaType, codeUnsupportedType, "请求体须为 JSON（Content-Type: application/json）", "the body must be JSON sent with Content-Type: application/json (got %q)", ct)
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		w.Header().Set("Connection", "close")
		return errf(http.StatusRequestEntityTooLarge, codeBodyTooLarge, "请求体过大（上限 %d 字节）", "request body too large (limit %d bytes)", s.cfg.MaxBodyBytes, s.cfg.MaxBodyBytes)
	}
	// Bound the body read in time too (a trickling client must not pin a
	// goroutine), then lift the deadline so the generation is not cut.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err == nil {
		_ = rc.SetReadDeadline(time.Time{})
	} else {
		// Keep the expired deadline (net/http would otherwise block trying
		// to drain the rest of the body for keep-alive) and drop the conn.
		w.Header().Set("Connection", "close")
	}
	if err != nil {
		var mbe *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &mbe):
			return errf(http.StatusRequestEntityTooLarge, codeBodyTooLarge, "请求体过大（上限 %d 字节）", "request body too large (limit %d bytes)", mbe.Limit, mbe.Limit)
		case errors.As(err, &ne) && ne.Timeout():
			return errf(http.StatusRequestTimeout, codeBodyTimeout, "读取请求体超时（%v）", "the request body did not arrive within %v", bodyReadTimeout, bodyReadTimeout)
		}
		return errf(http.StatusBadRequest, codeInvalidJSON, "读取请求体失败", "could not read the request body")
	}
	if !utf8.Valid(body) {
		return errf(http.StatusBadRequest, codeInvalidUTF8, "请求体不是有效的 UTF-8", "request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return errf(http.StatusBadRequest, codeInvalidJSON, "请求体只能包含一个 JSON 对象", "the body must hold exactly one JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errf(http.StatusBadRequest, codeInvalidJSON, "JSON 之后有多余内容", "unexpected data after the JSON object")
	}
	return nil
}

// jsonError turns a decoding error into a precise bilingual message.
func jsonError(err error) *apiError {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return errf(http.StatusBadRequest, codeInvalidJSON, "请求体为空，需要 JSON 对象", "empty body: a JSON object is required")
	case errors.As(err, &se):
		return errf(http.StatusBadRequest, codeInvalidJSON, "JSON 语法错误（第 %d 字节）", "malformed JSON at byte %d", se.Offset, se.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errf(http.StatusBadRequest, codeInvalidJSON, "JSON 不完整", "truncated JSON")
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			return errf(http.StatusBadRequest, codeInvalidJSON, "请求体须为 JSON 对象", "the body must be a JSON object, not %s", te.Value)
		}
		return errf(http.StatusBadRequest, codeInvalidField, "字段 %q 类型错误：需要 %s", "field %q has the wrong type: want %s, got %s", field, jsonTypeName(te.Type.String()), field, jsonTypeName(te.Type.String()), te.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return errf(http.StatusBadRequest, codeUnknownField, "未知字段 %s", "unknown field %s", f, f)
	default:
		return errf(http.StatusBadRequest, codeInvalidJSON, "无效的 JSON", "invalid JSON: %v", err)
	}
}

func jsonTypeName(goType string) string {
	switch strings.TrimPrefix(goType, "*") {
	case "string":
		return "string"
	case "int", "uint64", "int64":
		return "integer"
	case "float64", "float32":
		return "number"
	case "bool":
		return "boolean"
	}
	return goType
}

// isHanString reports whether s is non-empty and all Chinese characters.
func isHanString(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !unicode.Is(unicode.Han, r) {
			return false
		}
	}
	return true
}

// genParams are validated generation parameters shared by /generate and the
// OpenAI endpoints.
type genParams struct {
	Prompt      string
	Mode        couplet.Mode
	N           int
	Length      int
	Temperature *float64
	TopP        *float64
	TopK        *int
	Seed        *uint64
}

// validate checks ranges and the prompt's shape and builds the couplet
// request. The prompt is normalised first with couplet.Normalize (the
// function every interface uses: whitespace and zero-width characters
// stripped, traditional characters simplified).
func (p *genParams) validate() (couplet.Request, *apiError) {
	p.Prompt = couplet.Normalize(p.Prompt)
	req := couplet.Request{Mode: p.Mode, Text: p.Prompt, N: p.N, Length: p.Length}
	if p.Mode == "" {
		req.Mode = couplet.ModeKeyword
		p.Mode = couplet.ModeKeyword
	}
	switch req.Mode {
	case couplet.ModeKeyword, couplet.ModeAcrostic, couplet.ModeLower:
	default:
		return req, errf(http.StatusBadRequest, codeInvalidField, "mode 须为 keyword（吉祥词）、acrostic（藏头）或 lower（对下联）", "mode must be keyword, acrostic or lower, got %q", p.Mode).withParam("mode")
	}
	n := utf8.RuneCountInString(p.Prompt)
	switch {
	case n == 0:
		return req, errf(http.StatusBadRequest, codeInvalidPrompt, "请输入吉祥词，例如“平安”", "prompt is required: a blessing word such as 平安").withParam("prompt")
	case n > maxPromptRune:
		return req, errf(http.StatusBadRequest, codeInvalidPrompt, "输入过长（最多 %d 字）", "prompt too long (at most %d characters)", maxPromptRune, maxPromptRune).withParam("prompt")
	case req.Mode == couplet.ModeAcrostic && (n != 2 || !isHanString(p.Prompt)):
		return req, errf(http.StatusBadRequest, codeInvalidPrompt, "藏头请输入恰好两个汉字，例如“如意”（收到 %q）", "acrostic needs exactly two Chinese characters, e.g. 如意 (got %q)", p.Prompt, p.Prompt).withParam("prompt")
	case req.Mode == couplet.ModeKeyword && ((n != 1 && n != 2 && n != 4) || !isHanString(p.Prompt)):
		return req, errf(http.StatusBadRequest, codeInvalidPrompt, "请输入一个、两个或四个汉字的吉祥词，例如“福”“平安”“万事如意”（收到 %q）", "prompt must be a blessing word of one, two or four Chinese characters, e.g. 福, 平安, 万事如意 (got %q)", p.Prompt, p.Prompt).withParam("prompt")
	}
	if p.N < 1 || p.N > maxN {
		return req, errf(http.StatusBadRequest, codeInvalidField, "n 须在 1 到 %d 之间", "n must be between 1 and %d", maxN, maxN).withParam("n")
	}
	if p.Length != 0 && req.Mode != couplet.ModeLower && (p.Length < minLineLength || p.Length > maxLineLength) {
		return req, errf(http.StatusBadRequest, couplet.CodeBadLength, "length 须在 %d 到 %d 之间（常用 5、7、9、11）", "length must be between %d and %d (usual: 5, 7, 9, 11)", minLineLength, maxLineLength, minLineLength, maxLineLength).withParam("length")
	}
	if t := p.Temperature; t != nil {
		if !(*t >= 0 && *t <= couplet.Limits.MaxTemperature) {
			return req, errf(http.StatusBadRequest, codeInvalidField, "temperature 须在 0 到 %g 之间", "temperature must be between 0 and %g", couplet.Limits.MaxTemperature, couplet.Limits.MaxTemperature).withParam("temperature")
		}
		req.SetTemperature(*t) // 0 (and below couplet.GreedyBelow) = greedy
	}
	if tp := p.TopP; tp != nil {
		if !(*tp > 0 && *tp <= 1) {
			return req, errf(http.StatusBadRequest, codeInvalidField, "top_p 须在 (0, 1] 之间", "top_p must be in (0, 1]").withParam("top_p")
		}
		req.TopP = float32(*tp)
	}
	if k := p.TopK; k != nil {
		if *k < 0 || *k > couplet.Limits.MaxTopK {
			return req, errf(http.StatusBadRequest, codeInvalidField, "top_k 须 ≥ 0（0 表示关闭）", "top_k must be ≥ 0 (0 = off)").withParam("top_k")
		}
		if req.TopK == 0 {
			req.TopK = *k
		}
	}
	if p.Seed != nil {
		req.Seed = *p.Seed
	}
	return req, nil
}

// admit validates p (the HTTP layer's checks, then the generator's own,
// which know the model: line length range, characters) and takes an
// in-flight slot for it: the common start of every generation endpoint,
// run before any byte of the answer is written. When ok is false the error
// response has been written; otherwise the caller must call release when
// done.
func (s *Server) admit(ctx context.Context, w http.ResponseWriter, p *genParams) (req couplet.Request, b *Backend, release func(), ok bool) {
	req, e := p.validate()
	if e == nil {
		if v, isV := s.generator().(interface{ Validate(couplet.Request) error }); isV {
			if err := v.Validate(req); err != nil {
				e = mapGenError(err, s.cfg.RequestTimeout)
			}
		}
	}
	if e == nil {
		b, release, e = s.acquire(ctx, req)
	}
	if e != nil {
		s.stats.record(time.Now(), 0, e.Status) // the dashboard counts refusals and client errors too
		writeError(w, e)
		return req, nil, nil, false
	}
	return req, b, release, true
}

// generator is the attached generator, or nil while loading.
func (s *Server) generator() Generator {
	if b := s.backend.Load(); b != nil {
		return b.Generator
	}
	return nil
}

// acquire takes an in-flight slot for req, waiting in admission's short
// queue if it must, or reports why not (not ready, draining, overloaded,
// client gone while queued). release must be called when acquire returned
// nil.
func (s *Server) acquire(ctx context.Context, req couplet.Request) (*Backend, func(), *apiError) {
	switch s.state.Load() {
	case stateDraining:
		e := errf(http.StatusServiceUnavailable, codeShuttingDown, "服务正在关闭", "server is shutting down")
		e.RetryAfter = 5
		s.metrics.rejected.WithLabelValues(codeShuttingDown).Inc()
		return nil, nil, e
	}
	b := s.backend.Load()
	if b == nil || b.Generator == nil {
		e := errf(http.StatusServiceUnavailable, codeNotReady, "模型加载中，请稍候", "the model is still loading, retry shortly")
		e.RetryAfter = 2
		s.metrics.rejected.WithLabelValues(codeNotReady).Inc()
		return nil, nil, e
	}
	select {
	case s.inflight <- struct{}{}:
	default:
		e := errf(http.StatusServiceUnavailable, codeOverloaded, "服务繁忙，请稍后重试", "server overloaded (%d requests in flight), retry later", cap(s.inflight))
		e.RetryAfter = 1
		s.metrics.rejected.WithLabelValues(codeOverloaded).Inc()
		return nil, nil, e
	}
	tk, v, retry := s.adm.tryAdmit(requestCost(req))
	switch v {
	case refused:
		<-s.inflight
		e := errf(http.StatusServiceUnavailable, codeOverloaded, "服务繁忙，请稍后重试", "server at capacity: this request would wait too long, retry later")
		e.RetryAfter = retry
		s.metrics.rejected.WithLabelValues("capacity").Inc()
		return nil, nil, e
	case queued:
		select {
		case <-tk.ready:
		case <-ctx.Done():
			if !s.adm.cancel(tk) {
				s.adm.done(tk, 0, 0) // it started as the client left
			}
			<-s.inflight
			return nil, nil, mapGenError(ctx.Err(), s.cfg.RequestTimeout)
		}
	}
	t0 := time.Now()
	return b, func() {
		s.adm.done(tk, requestSteps(req), time.Since(t0))
		<-s.inflight
	}, nil
}

// genResult is one finished generation with its accounting.
type genResult struct {
	couplets []couplet.Couplet
	usage    usageJSON
	latency  time.Duration
}

// run executes one validated request under the request timeout, recording
// stats. The returned error is already mapped for the client.
func (s *Server) run(ctx context.Context, b *Backend, req couplet.Request) (*genResult, *apiError) {
	t0 := time.Now()
	if s.cfg.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.RequestTimeout)
		defer cancel()
	}
	u := &usage{}
	cs, err := b.Generator.Generate(withUsage(ctx, u), req)
	lat := time.Since(t0)
	if err == nil && len(cs) == 0 {
		err = errf(http.StatusInternalServerError, codeNoCouplet, "未能生成春联", "no couplet was generated")
	}
	if err != nil {
		if errors.Is(err, couplet.ErrNoCouplet) {
			err = errf(http.StatusInternalServerError, codeNoCouplet, "多次尝试后仍未生成合格的春联，请换个词或重试", "no well-formed couplet found within the attempt budget; try again or another word")
		}
		ae := mapGenError(err, s.cfg.RequestTimeout)
		if ae.Status == http.StatusServiceUnavailable {
			s.metrics.rejected.WithLabelValues(ae.Code).Inc()
		}
		s.stats.record(time.Now(), lat, ae.Status)
		s.log.Info("generation failed", "request_id", requestID(ctx), "code", ae.Code, "err", err)
		return nil, ae
	}
	s.stats.record(time.Now(), lat, http.StatusOK)
	res := &genResult{couplets: cs, latency: lat}
	res.usage.PromptTokens = u.prompt.Load()
	res.usage.CompletionTokens = u.completion.Load()
	if u.engineRequests.Load() == 0 {
		// Generator not instrumented (tests with fakes): count characters.
		res.usage.PromptTokens = int64(utf8.RuneCountInString(req.Text))
		for _, c := range cs {
			res.usage.CompletionTokens += int64(utf8.RuneCountInString(c.Upper + c.Lower + c.Banner))
		}
	}
	res.usage.TotalTokens = res.usage.PromptTokens + res.usage.CompletionTokens
	return res, nil
}

func (s *Server) handleGenerate(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var body generateRequest
	if e := s.readJSON(w, r, &body, true); e != nil {
		writeError(w, e)
		return
	}
	p := genParams{Mode: couplet.Mode(body.Mode), N: 1, Temperature: body.Temperature, TopP: body.TopP, TopK: body.TopK, Seed: body.Seed}
	if body.Prompt != nil {
		p.Prompt = *body.Prompt
	}
	if body.N != nil {
		p.N = *body.N
	}
	if body.Length != nil {
		p.Length = *body.Length
		if p.Length == 0 {
			p.Length = -1 // explicit 0 is out of range, not "default"
		}
	}
	req, b, release, ok := s.admit(r.Context(), w, &p)
	if !ok {
		return
	}
	defer release()
	if body.Stream {
		s.streamGenerate(w, r, b, req, p)
		return
	}
	res, e := s.run(r.Context(), b, req)
	if e != nil {
		writeError(w, e)
		return
	}
	resp := s.generateResponse(r, p, res)
	// Server-Timing (W3C): generation, and the handler from the request's
	// routing to its answer, so that a client can tell the server's own
	// HTTP work and the network from the generation.
	w.Header().Set("Server-Timing", fmt.Sprintf("generate;dur=%.3f, handler;dur=%.3f",
		float64(res.latency.Microseconds())/1000, float64(time.Since(start).Microseconds())/1000))
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) generateResponse(r *http.Request, p genParams, res *genResult) generateResponse {
	return generateResponse{
		GeneratedText: res.couplets[0].Text(),
		Prompt:        p.Prompt,
		Mode:          string(p.Mode),
		Couplets:      res.couplets,
		LatencyMS:     float64(res.latency.Microseconds()) / 1000,
		Usage:         res.usage,
		RequestID:     requestID(r.Context()),
	}
}

// eventWriter writes stream events as SSE ("event: NAME\ndata: JSON\n\n")
// or NDJSON ({"event":NAME,"data":JSON}\n), flushing each. Only the handler
// goroutine writes (engine callbacks go through a channel); mu and closed
// keep it safe should a later change write from elsewhere, and make writes
// after the handler returned no-ops.
type eventWriter struct {
	mu     sync.Mutex
	w      http.ResponseWriter
	ndjson bool
	closed bool
}

func (ew *eventWriter) send(event string, data any) {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	if ew.closed {
		return
	}
	js, err := json.Marshal(data)
	if err != nil {
		js = []byte(`{}`)
	}
	if ew.ndjson {
		fmt.Fprintf(ew.w, "{\"event\":%q,\"data\":%s}\n", event, js)
	} else {
		fmt.Fprintf(ew.w, "event: %s\ndata: %s\n\n", event, js)
	}
	if f, ok := ew.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (ew *eventWriter) close() {
	ew.mu.Lock()
	ew.closed = true
	ew.mu.Unlock()
}

// tokenEventJSON is the data of a stream "token" event.
type tokenEventJSON struct {
	Attempt int    `json:"attempt"`
	Sample  int    `json:"sample"`
	Part    string `json:"part"`
	Text    string `json:"text"`
}

// streamGenerate answers a "stream": true request. Format: SSE unless the
// client's Accept asks for application/x-ndjson. Events: "start" (request
// id), "token" (every decoded token of every sample, as the engine produces
// them; samples may be dropped by ranking), then exactly one of "result"
// (the same object as the non-streaming answer) or "error" ({"error":{…}}).
func (s *Server) streamGenerate(w http.ResponseWriter, r *http.Request, b *Backend, req couplet.Request, p genParams) {
	ew := &eventWriter{w: w, ndjson: strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")}
	defer ew.close()
	if ew.ndjson {
		w.Header().Set("Content-Type", "application/x-ndjson; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	}
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	ew.send("start", map[string]string{"request_id": requestID(r.Context()), "prompt": p.Prompt, "mode": string(p.Mode)})
	res, e := s.runStreaming(r.Context(), b, req, func(ev couplet.TokenEvent) {
		ew.send("token", tokenEventJSON{Attempt: ev.Attempt, Sample: ev.Sample, Part: string(ev.Part), Text: ev.Text})
	})
	if e != nil {
		if e.Type == "" {
			e.Type = errorType(e.Status)
		}
		ew.send("error", map[string]*apiError{"error": e})
		return
	}
	ew.send("result", s.generateResponse(r, p, res))
}
