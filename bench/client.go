package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// API names the request format of a target.
const (
	APIGenerate = "generate" // chunlian's POST /generate (the seed's API)
	APIOpenAI   = "openai"   // POST /v1/completions
)

// outcome classifies one request.
type outcome uint8

const (
	outcomeOK       outcome = iota
	outcomeFailed           // transport error, non-2xx other than 503, bad body, error event
	outcomeRejected         // HTTP 503: the server's queue was full
	outcomeAborted          // our own context ended (Ctrl-C, run deadline): not counted at all
)

// sample is the client-side record of one request. Owned by the goroutine
// that made the request until it is handed to the collector.
type sample struct {
	start    time.Time
	latency  time.Duration // send → last byte of the response
	ttft     time.Duration // send → first generated text; 0 when unknown (no streaming)
	server   time.Duration // the server's own time for the request (chunlian's latency_ms); 0 when not reported
	tokens   int           // output tokens (usage when reported, else Han characters)
	couplets int           // couplets / choices returned
	outcome  outcome
	err      string        // short error class for the report when failed
	retry    time.Duration // Retry-After of a 503, 0 if none
}

// client sends bench requests to one target. Safe for concurrent use.
type client struct {
	base      string // base URL without trailing slash
	api       string
	model     string // "model" field of OpenAI requests
	stream    bool
	n         int // samples per request ("n")
	maxTokens int // OpenAI max_tokens; 0 = leave to the server
	unseeded  bool
	hc        *http.Client
}

func newClient(t Target, o Options, maxConns int) *client {
	tr := &http.Transport{
		// No proxy from the environment: the bench must talk to exactly the
		// URL it was given (the loopback check relies on it).
		Proxy:               nil,
		MaxIdleConns:        0, // no global limit
		MaxIdleConnsPerHost: maxConns + 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &client{
		base:      strings.TrimRight(t.URL, "/"),
		api:       t.API,
		model:     t.Model,
		stream:    o.Stream,
		n:         o.N,
		maxTokens: o.MaxTokens,
		unseeded:  o.Unseeded,
		// The per-request timeout is applied through the context, so a
		// streaming read is bounded as well.
		hc: &http.Client{Transport: tr},
	}
}

func (c *client) close() { c.hc.CloseIdleConnections() }

// body builds the JSON request body for p.
func (c *client) body(p Prompt) ([]byte, string) {
	if c.api == APIOpenAI {
		req := map[string]any{"prompt": p.Text, "stream": c.stream}
		if !c.unseeded {
			req["seed"] = p.Seed
		}
		if c.model != "" {
			req["model"] = c.model
		}
		if c.maxTokens > 0 {
			req["max_tokens"] = c.maxTokens
		}
		if c.n > 1 {
			req["n"] = c.n
		}
		if c.stream {
			// OpenAI only sends usage in a stream when asked; chunlian sends it anyway.
			req["stream_options"] = map[string]any{"include_usage": true}
		}
		b, _ := json.Marshal(req)
		return b, "/v1/completions"
	}
	req := map[string]any{"prompt": p.Text, "mode": p.Mode, "n": c.n, "stream": c.stream}
	if !c.unseeded {
		req["seed"] = p.Seed
	}
	b, _ := json.Marshal(req)
	return b, "/generate"
}

// do sends one request and measures it. It never panics on a bad server: every
// problem becomes a failed sample with a short error class.
func (c *client) do(ctx context.Context, p Prompt, timeout time.Duration) sample {
	body, path := c.body(p)
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return sample{start: time.Now(), outcome: outcomeFailed, err: "build request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if c.stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	s := sample{start: time.Now()}
	fail := func(class string) sample {
		s.latency = time.Since(s.start)
		switch {
		case ctx.Err() != nil:
			s.outcome = outcomeAborted
		case errors.Is(rctx.Err(), context.DeadlineExceeded):
			s.outcome, s.err = outcomeFailed, "client timeout"
		case isOverload(class):
			// A stream that already sent 200 can only report a full queue
			// in an error event; it is the same rejection as a 503.
			s.outcome = outcomeRejected
		default:
			s.outcome, s.err = outcomeFailed, class
		}
		return s
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fail("transport: " + shortErr(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		s.latency = time.Since(s.start)
		s.outcome = outcomeRejected
		if secs, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && secs > 0 {
			s.retry = time.Duration(secs) * time.Second
		}
		return s
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return fail(fmt.Sprintf("HTTP %d%s", resp.StatusCode, errCode(b)))
	}
	if c.stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") ||
		c.stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
		if class := c.readStream(resp.Body, &s); class != "" {
			return fail(class)
		}
	} else {
		// A non-streamed body (also what a server that ignores "stream" sends).
		b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		if err != nil {
			return fail("read body: " + shortErr(err))
		}
		var ch chunk
		if err := json.Unmarshal(b, &ch); err != nil {
			return fail("bad JSON body")
		}
		if ch.isError() {
			return fail("error body" + errCode(b))
		}
		var acc accum
		acc.add(&ch)
		s.tokens, s.couplets = acc.result()
		s.server = acc.server
	}
	s.latency = time.Since(s.start)
	return s
}

// readStream consumes an SSE ("data: {…}" lines, "data: [DONE]") or NDJSON
// stream, filling s.ttft, s.tokens and s.couplets. It returns a non-empty
// error class on failure.
func (c *client) readStream(r io.Reader, s *sample) string {
	br := bufio.NewReaderSize(r, 64<<10)
	var acc accum
	for {
		line, err := br.ReadBytes('\n')
		line = bytes.TrimSpace(line)
		if len(line) > 0 {
			payload := line
			if bytes.HasPrefix(line, []byte("data:")) {
				payload = bytes.TrimSpace(line[len("data:"):])
			} else if line[0] != '{' {
				payload = nil // "event:", "id:", ": comment" lines
			}
			if bytes.Equal(payload, []byte("[DONE]")) {
				break
			}
			if len(payload) > 0 {
				var ch chunk
				if jerr := json.Unmarshal(payload, &ch); jerr != nil {
					return "bad stream event"
				}
				if inner := ch.unwrap(); inner.isError() {
					if inner != &ch {
						payload = ch.Data
					}
					return "error event" + errCode(payload)
				}
				if acc.add(&ch) && s.ttft == 0 {
					s.ttft = time.Since(s.start)
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return "read stream: " + shortErr(err)
		}
	}
	s.tokens, s.couplets = acc.result()
	s.server = acc.server
	return ""
}

// chunk is the union of every response or stream event shape the bench
// understands: chunlian's /generate final object, OpenAI completions (and chat)
// chunks, and token events of a /generate stream ({"token"|"text"|"delta": …}).
// Raw fields are kept raw because servers differ in their types (a token may
// be an id or a string).
type chunk struct {
	Error         json.RawMessage `json:"error"`
	GeneratedText string          `json:"generated_text"`
	// LatencyMS is chunlian's latency_ms: the time the server spent
	// generating, without the network and its own HTTP handling.
	LatencyMS float64 `json:"latency_ms"`
	Couplets  []struct {
		Upper  string `json:"upper"`
		Lower  string `json:"lower"`
		Banner string `json:"banner"`
	} `json:"couplets"`
	Choices []struct {
		Index int    `json:"index"`
		Text  string `json:"text"`
		Delta *struct {
			Content string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Token json.RawMessage `json:"token"`
	Text  json.RawMessage `json:"text"`
	Delta json.RawMessage `json:"delta"`
	// Data is the payload of an NDJSON event line {"event":…,"data":{…}}
	// (chunlian's /generate stream with Accept: application/x-ndjson).
	Data json.RawMessage `json:"data"`
}

// unwrap returns the chunk inside an NDJSON event wrapper, or c itself.
func (c *chunk) unwrap() *chunk {
	if len(c.Data) == 0 || c.Data[0] != '{' {
		return c
	}
	var inner chunk
	if json.Unmarshal(c.Data, &inner) != nil {
		return c
	}
	return &inner
}

func (c *chunk) isError() bool {
	return len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null"))
}

// accum folds the chunks of one response into token and couplet counts.
// Precedence of token counts: the server's usage, then the Han characters of
// the final couplets, then the Han characters of streamed text, then the
// number of token events.
type accum struct {
	usage       int // last usage.completion_tokens seen, valid when hasUsage
	hasUsage    bool
	finalHan    int // Han characters of final couplets / generated_text
	hasFinal    bool
	streamHan   int           // Han characters of streamed text pieces
	tokenEvents int           // events that carried generated text or a token id
	couplets    int           // couplets of the final object
	choices     map[int]bool  // choice indexes that carried text
	server      time.Duration // the final object's latency_ms, 0 if absent
}

var labelReplacer = strings.NewReplacer("上联：", "", "下联：", "", "横批：", "", "上联:", "", "下联:", "", "横批:", "")

// add folds ch in and reports whether ch carried generated text (for TTFT).
func (a *accum) add(ch *chunk) bool {
	ch = ch.unwrap()
	carried := false
	if ch.Usage != nil {
		a.usage, a.hasUsage = ch.Usage.CompletionTokens, true
	}
	if ch.LatencyMS > 0 {
		a.server = time.Duration(ch.LatencyMS * float64(time.Millisecond))
	}
	if len(ch.Couplets) > 0 {
		a.hasFinal = true
		a.finalHan = 0
		for _, cp := range ch.Couplets {
			a.finalHan += countHan(cp.Upper) + countHan(cp.Lower) + countHan(cp.Banner)
		}
		a.couplets = len(ch.Couplets)
	} else if ch.GeneratedText != "" {
		a.hasFinal = true
		a.finalHan = countHan(labelReplacer.Replace(ch.GeneratedText))
		a.couplets = 1
	}
	for _, c := range ch.Choices {
		text := c.Text
		if c.Delta != nil {
			text += c.Delta.Content
		}
		if c.Message != nil {
			text += c.Message.Content
		}
		if text != "" {
			carried = true
			a.streamHan += countHan(labelReplacer.Replace(text))
			if a.choices == nil {
				a.choices = map[int]bool{}
			}
			a.choices[c.Index] = true
		}
	}
	for _, raw := range []json.RawMessage{ch.Token, ch.Text, ch.Delta} {
		if len(raw) == 0 || bytes.Equal(raw, []byte("null")) || bytes.Equal(raw, []byte(`""`)) {
			continue
		}
		carried = true
		var s string
		if json.Unmarshal(raw, &s) == nil {
			a.streamHan += countHan(s)
		}
	}
	if carried {
		a.tokenEvents++
	}
	return carried
}

// result returns (output tokens, couplets).
func (a *accum) result() (int, int) {
	cp := a.couplets
	if cp == 0 && len(a.choices) > 0 {
		cp = len(a.choices)
	}
	switch {
	case a.hasUsage:
		return a.usage, cp
	case a.hasFinal:
		return a.finalHan, cp
	case a.streamHan > 0:
		return a.streamHan, max(cp, 1)
	case a.tokenEvents > 0:
		return a.tokenEvents, max(cp, 1)
	default:
		return 0, cp
	}
}

// errCode extracts ": code" from an {"error":{"code":…}} body, or "".
func errCode(b []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
		return ": " + e.Error.Code
	}
	return ""
}

// overloadCodes are error codes that mean "rejected for load" (chunlian's
// queue_full and overloaded; both come with HTTP 503 when sent before the
// stream starts).
var overloadCodes = []string{": queue_full", ": overloaded"}

// isOverload reports whether a failure class ends in an overload code.
func isOverload(class string) bool {
	for _, c := range overloadCodes {
		if strings.HasSuffix(class, c) {
			return true
		}
	}
	return false
}

// shortErr keeps error classes few: the report groups failures by message, so
// per-connection details (ports) are cut.
func shortErr(err error) string {
	s := err.Error()
	for _, k := range []string{"connection refused", "connection reset", "EOF", "broken pipe", "timeout"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}
