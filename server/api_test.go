package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"chunlian/couplet"
)

func TestGenerateRealStack(t *testing.T) {
	rs := newRealStack(t, stackOpts{})
	for _, tc := range []struct {
		name string
		body map[string]any
		n    int
	}{
		{"seed-compatible", map[string]any{"prompt": "平安"}, 1},
		{"keyword n=3 length 5", map[string]any{"prompt": "吉祥", "n": 3, "length": 5, "seed": 42}, 3},
		{"acrostic", map[string]any{"prompt": "如意", "mode": "acrostic", "temperature": 0.7, "top_p": 0.9}, 1},
		{"greedy", map[string]any{"prompt": "富贵", "temperature": 0}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := post(t, rs.base+"/generate", tc.body, "X-Request-ID", "test-id-1")
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			if got := hdr.Get("X-Request-ID"); got != "test-id-1" {
				t.Errorf("X-Request-ID = %q, want echo", got)
			}
			var res generateResponse
			if err := json.Unmarshal(body, &res); err != nil {
				t.Fatal(err)
			}
			// Server-Timing: generation as latency_ms says, inside the handler.
			var gen, handler float64
			if n, err := fmt.Sscanf(hdr.Get("Server-Timing"), "generate;dur=%g, handler;dur=%g", &gen, &handler); n != 2 || err != nil ||
				math.Abs(gen-res.LatencyMS) > 0.0011 || handler < gen || gen <= 0 {
				t.Errorf("Server-Timing %q (latency_ms %g): %v", hdr.Get("Server-Timing"), res.LatencyMS, err)
			}
			if res.Prompt != tc.body["prompt"] {
				t.Errorf("prompt = %q", res.Prompt)
			}
			if len(res.Couplets) < 1 || len(res.Couplets) > tc.n {
				t.Fatalf("%d couplets, want 1..%d", len(res.Couplets), tc.n)
			}
			up, low, ban := checkCoupletText(t, res.GeneratedText)
			if c := res.Couplets[0]; c.Upper != up || c.Lower != low || c.Banner != ban {
				t.Errorf("generated_text %q does not match couplets[0] %+v", res.GeneratedText, c)
			}
			for _, c := range res.Couplets {
				if r := couplet.Check(c.Upper, c.Lower, c.Banner); !r.Rule1() || !r.Rule4() {
					t.Errorf("malformed couplet %+v: %v", c, r.Failed())
				}
				if tc.body["length"] != nil && utf8.RuneCountInString(c.Upper) != tc.body["length"].(int) {
					t.Errorf("upper %q: want length %v", c.Upper, tc.body["length"])
				}
			}
			if tc.body["mode"] == "acrostic" {
				p := []rune(tc.body["prompt"].(string))
				if []rune(up)[0] != p[0] || []rune(low)[0] != p[1] {
					t.Errorf("acrostic %q/%q does not start with %q", up, low, tc.body["prompt"])
				}
			}
			if res.Usage.PromptTokens <= 0 || res.Usage.CompletionTokens <= 0 || res.Usage.TotalTokens != res.Usage.PromptTokens+res.Usage.CompletionTokens {
				t.Errorf("usage %+v", res.Usage)
			}
		})
	}
	waitIdle(t, rs.eng)
}

func TestGenerateRejectsMalformed(t *testing.T) {
	_, base := newFakeServer(t, Config{MaxBodyBytes: 1024}, nil)
	big := `{"prompt":"平安","mode":"` + strings.Repeat("x", 2000) + `"}`
	for _, tc := range []struct {
		name   string
		body   any
		ctype  string
		status int
		code   string
	}{
		{"bad json", `{"prompt":`, "", 400, codeInvalidJSON},
		{"syntax", `{prompt: 平安}`, "", 400, codeInvalidJSON},
		{"empty body", ``, "", 400, codeInvalidJSON},
		{"not an object", `["平安"]`, "", 400, codeInvalidJSON},
		{"two objects", `{"prompt":"平安"}{"prompt":"平安"}`, "", 400, codeInvalidJSON},
		{"wrong type prompt", `{"prompt":12}`, "", 400, codeInvalidField},
		{"wrong type n", `{"prompt":"平安","n":"3"}`, "", 400, codeInvalidField},
		{"fractional n", `{"prompt":"平安","n":1.5}`, "", 400, codeInvalidField},
		{"negative seed", `{"prompt":"平安","seed":-1}`, "", 400, codeInvalidField},
		{"unknown field", `{"prompt":"平安","foo":1}`, "", 400, codeUnknownField},
		{"invalid utf8", []byte("{\"prompt\":\"\xff\xfe\"}"), "", 400, codeInvalidUTF8},
		{"missing prompt", `{}`, "", 400, codeInvalidPrompt},
		{"five chars", `{"prompt":"平安喜乐福"}`, "", 400, codeInvalidPrompt},
		{"three chars", `{"prompt":"平安喜"}`, "", 400, codeInvalidPrompt},
		{"latin", `{"prompt":"ab"}`, "", 400, codeInvalidPrompt},
		{"acrostic latin", `{"prompt":"a平","mode":"acrostic"}`, "", 400, codeInvalidPrompt},
		{"bad mode", `{"prompt":"平安","mode":"poem"}`, "", 400, codeInvalidField},
		{"n zero", `{"prompt":"平安","n":0}`, "", 400, codeInvalidField},
		{"n huge", `{"prompt":"平安","n":1000}`, "", 400, codeInvalidField},
		{"length zero", `{"prompt":"平安","length":0}`, "", 400, couplet.CodeBadLength},
		{"temperature", `{"prompt":"平安","temperature":3}`, "", 400, codeInvalidField},
		{"top_p zero", `{"prompt":"平安","top_p":0}`, "", 400, codeInvalidField},
		{"top_k negative", `{"prompt":"平安","top_k":-2}`, "", 400, codeInvalidField},
		{"oversize", big, "", 413, codeBodyTooLarge},
		{"content type", `{"prompt":"平安"}`, "multipart/form-data; boundary=x", 415, codeUnsupportedType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.ctype != "" {
				hdr = []string{"Content-Type", tc.ctype}
			}
			code, _, body := post(t, base+"/generate", tc.body, hdr...)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %s", code, tc.status, body)
			}
			checkError(t, body, tc.code)
		})
	}
	// Blessing words of one and four characters are keywords too (福,
	// 万事如意; traditional characters are simplified first).
	for _, p := range []string{"福", "万事如意", "福壽"} {
		if code, _, body := post(t, base+"/generate", `{"prompt":"`+p+`"}`); code != 200 {
			t.Errorf("prompt %s: status %d: %s", p, code, body)
		}
	}
	t.Run("wrong method", func(t *testing.T) {
		code, hdr, body := get(t, base+"/generate")
		if code != http.StatusMethodNotAllowed || hdr.Get("Allow") != "POST" {
			t.Fatalf("status %d Allow %q", code, hdr.Get("Allow"))
		}
		checkError(t, body, codeMethod)
	})
	t.Run("unknown path", func(t *testing.T) {
		code, _, body := get(t, base+"/nope")
		if code != http.StatusNotFound {
			t.Fatalf("status %d", code)
		}
		checkError(t, body, codeNotFound)
	})
}

// The generator's own validation errors (*couplet.InputError) reach the
// client as 400 with their code, on the real stack.
func TestGenerateInputErrorFromGenerator(t *testing.T) {
	rs := newRealStack(t, stackOpts{})
	for _, tc := range []struct{ body, code string }{
		{`{"prompt":"春春","mode":"acrostic"}`, couplet.CodeSameHeads},
		{`{"prompt":"春回大地abc","mode":"lower"}`, couplet.CodeBadChar},
		{`{"prompt":"平安","length":99}`, couplet.CodeBadLength},
		{`{"prompt":"平安","length":32}`, couplet.CodeBadLength},
		{`{"prompt":"平安","length":2}`, couplet.CodeBadLength},
	} {
		code, _, body := post(t, rs.base+"/generate", tc.body)
		if code != http.StatusBadRequest {
			t.Fatalf("%s: status %d: %s", tc.body, code, body)
		}
		checkError(t, body, tc.code)
	}
}

// sseEvents parses an SSE body into (event, data) pairs.
func sseEvents(t *testing.T, body []byte) (events, datas []string) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(body))
	ev := "message"
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			ev = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			events = append(events, ev)
			datas = append(datas, strings.TrimPrefix(line, "data: "))
			ev = "message"
		}
	}
	return
}

func TestGenerateStream(t *testing.T) {
	rs := newRealStack(t, stackOpts{})
	t.Run("sse", func(t *testing.T) {
		code, hdr, body := post(t, rs.base+"/generate", map[string]any{"prompt": "平安", "stream": true, "seed": 3})
		if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d type %q", code, hdr.Get("Content-Type"))
		}
		evs, datas := sseEvents(t, body)
		if len(evs) < 3 || evs[0] != "start" || evs[len(evs)-1] != "result" {
			t.Fatalf("events %v", evs)
		}
		tokens := 0
		for i, e := range evs[1 : len(evs)-1] {
			if e != "token" {
				t.Fatalf("event %d = %q, want token", i+1, e)
			}
			var tk tokenEventJSON
			if err := json.Unmarshal([]byte(datas[i+1]), &tk); err != nil || utf8.RuneCountInString(tk.Text) != 1 {
				t.Fatalf("token %q: %v", datas[i+1], err)
			}
			tokens++
		}
		if tokens == 0 {
			t.Error("no token events")
		}
		var res generateResponse
		if err := json.Unmarshal([]byte(datas[len(datas)-1]), &res); err != nil {
			t.Fatal(err)
		}
		checkCoupletText(t, res.GeneratedText)
	})
	t.Run("ndjson", func(t *testing.T) {
		code, hdr, body := post(t, rs.base+"/generate", map[string]any{"prompt": "吉祥", "stream": true}, "Accept", "application/x-ndjson")
		if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/x-ndjson") {
			t.Fatalf("status %d type %q", code, hdr.Get("Content-Type"))
		}
		lines := strings.Split(strings.TrimSpace(string(body)), "\n")
		var last struct {
			Event string           `json:"event"`
			Data  generateResponse `json:"data"`
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Event != "result" {
			t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
		}
		checkCoupletText(t, last.Data.GeneratedText)
		var first struct{ Event string }
		if json.Unmarshal([]byte(lines[0]), &first); first.Event != "start" {
			t.Errorf("first event %q", first.Event)
		}
	})
	t.Run("bad input is a 4xx before streaming", func(t *testing.T) {
		// The generator's own checks run before the headers: a streamed
		// request with bad input gets the status a plain one gets.
		for _, body := range []map[string]any{
			{"prompt": "春春", "mode": "acrostic", "stream": true},
			{"prompt": "平安", "length": 32, "stream": true},
		} {
			code, hdr, b := post(t, rs.base+"/generate", body)
			if code != 400 || strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("%v: status %d type %q", body, code, hdr.Get("Content-Type"))
			}
			checkError(t, b, "")
		}
	})
}

func TestOpenAICompatible(t *testing.T) {
	rs := newRealStack(t, stackOpts{})
	t.Run("models", func(t *testing.T) {
		code, _, body := get(t, rs.base+"/v1/models")
		var res struct {
			Object string `json:"object"`
			Data   []struct{ ID string }
		}
		if code != 200 || json.Unmarshal(body, &res) != nil || res.Object != "list" || len(res.Data) != 1 || res.Data[0].ID != "chunlian-test" {
			t.Fatalf("status %d body %s", code, body)
		}
	})
	type usageT struct{ PromptTokens, CompletionTokens, TotalTokens int }
	checkUsage := func(t *testing.T, raw json.RawMessage) {
		var u struct {
			P int `json:"prompt_tokens"`
			C int `json:"completion_tokens"`
			T int `json:"total_tokens"`
		}
		if err := json.Unmarshal(raw, &u); err != nil || u.P <= 0 || u.C <= 0 || u.T != u.P+u.C {
			t.Errorf("usage %s", raw)
		}
	}
	_ = usageT{}
	t.Run("completions", func(t *testing.T) {
		code, _, body := post(t, rs.base+"/v1/completions", map[string]any{"model": "chunlian-test", "prompt": "平安", "max_tokens": 32, "n": 2, "logprobs": nil, "user": "x"})
		var res struct {
			Object  string `json:"object"`
			Choices []struct {
				Index        int    `json:"index"`
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			}
			Usage json.RawMessage
		}
		if code != 200 || json.Unmarshal(body, &res) != nil || res.Object != "text_completion" || len(res.Choices) == 0 {
			t.Fatalf("status %d body %s", code, body)
		}
		for _, c := range res.Choices {
			checkCoupletText(t, c.Text)
			if c.FinishReason != "stop" {
				t.Errorf("finish_reason %q", c.FinishReason)
			}
		}
		checkUsage(t, res.Usage)
	})
	t.Run("completions lower mode by length", func(t *testing.T) {
		// Four Chinese characters would be a blessing phrase (万事如意):
		// five are a 上联.
		code, _, body := post(t, rs.base+"/v1/completions", map[string]any{"prompt": []string{"春回大地暖"}})
		var res struct{ Choices []struct{ Text string } }
		if code != 200 || json.Unmarshal(body, &res) != nil {
			t.Fatalf("status %d body %s", code, body)
		}
		up, _, _ := checkCoupletText(t, res.Choices[0].Text)
		if up != "春回大地暖" {
			t.Errorf("lower mode kept upper %q, want 春回大地暖", up)
		}
	})
	t.Run("chat", func(t *testing.T) {
		code, _, body := post(t, rs.base+"/v1/chat/completions", map[string]any{
			"model": "chunlian-test", "messages": []map[string]any{
				{"role": "system", "content": "你是春联助手"},
				{"role": "user", "content": []map[string]string{{"type": "text", "text": "吉祥"}}},
			}})
		var res struct {
			Object  string
			Choices []struct {
				Message struct{ Role, Content string }
			}
			Usage json.RawMessage
		}
		if code != 200 || json.Unmarshal(body, &res) != nil || res.Object != "chat.completion" {
			t.Fatalf("status %d body %s", code, body)
		}
		if res.Choices[0].Message.Role != "assistant" {
			t.Errorf("role %q", res.Choices[0].Message.Role)
		}
		checkCoupletText(t, res.Choices[0].Message.Content)
		checkUsage(t, res.Usage)
	})

}

func TestHealthAndReadiness(t *testing.T) {
	srv, err := New(Config{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ts := newHTTPTest(t, srv)
	if code, _, _ := get(t, ts+"/health"); code != 200 {
		t.Errorf("/health while loading: %d", code)
	}
	code, hdr, _ := get(t, ts+"/ready")
	if code != 503 || hdr.Get("Retry-After") == "" {
		t.Errorf("/ready while loading: %d", code)
	}
	code, _, body := post(t, ts+"/generate", `{"prompt":"平安"}`)
	if code != 503 {
		t.Fatalf("/generate while loading: %d", code)
	}
	checkError(t, body, codeNotReady)
	if err := srv.Warmup(context.Background()); err == nil {
		t.Error("warm-up without a backend succeeded")
	}
	// A backend whose warm-up fails keeps the server not ready.
	srv.Attach(Backend{Generator: fakeGen{func(context.Context, couplet.Request) ([]couplet.Couplet, error) {
		return nil, nil
	}}})
	if err := srv.Warmup(context.Background()); err == nil {
		t.Error("warm-up with an empty answer succeeded")
	}
	if code, _, _ := get(t, ts+"/ready"); code != 503 {
		t.Errorf("/ready after failed warm-up: %d", code)
	}
	// Lower mode may run on other engines: a failure there keeps the
	// server not ready too, and it is warmed with the keyword couplet's 上联.
	var modes []string
	srv.Attach(Backend{Generator: fakeGen{func(_ context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		modes = append(modes, string(req.Mode)+":"+req.Text)
		if req.Mode == couplet.ModeLower {
			return nil, errors.New("lower mode broken")
		}
		return []couplet.Couplet{fakeCouplet}, nil
	}}})
	if err := srv.Warmup(context.Background()); err == nil || !strings.Contains(err.Error(), "lower mode broken") {
		t.Errorf("warm-up with lower mode failing: %v", err)
	}
	if want := []string{"keyword:平安", "lower:" + fakeCouplet.Upper}; !slices.Equal(modes, want) {
		t.Errorf("warm-up requests %q, want %q", modes, want)
	}
	if code, _, _ := get(t, ts+"/ready"); code != 503 {
		t.Errorf("/ready after failed lower-mode warm-up: %d", code)
	}
	srv.Attach(Backend{Generator: fakeGen{func(context.Context, couplet.Request) ([]couplet.Couplet, error) {
		return []couplet.Couplet{fakeCouplet}, nil
	}}})
	if err := srv.Warmup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := get(t, ts+"/ready"); code != 200 {
		t.Errorf("/ready after warm-up: %d", code)
	}
}

// /debug/pprof/ exists only with Config.Pprof, and behind the API key when
// one is set.
func TestPprofEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		auth string
		want int
	}{
		{"off", Config{}, "", http.StatusNotFound},
		{"on", Config{Pprof: true}, "", http.StatusOK},
		{"on, key missing", Config{Pprof: true, APIKey: "k"}, "", http.StatusUnauthorized},
		{"on, key given", Config{Pprof: true, APIKey: "k"}, "Bearer k", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, url := newFakeServer(t, tc.cfg, nil)
			req, _ := http.NewRequest(http.MethodGet, url+"/debug/pprof/cmdline", nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("GET /debug/pprof/cmdline: %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// TestOpenAIErrors checks the OpenAI endpoints' input errors on the real
// stack.
func TestOpenAIErrors(t *testing.T) {
	rs := newRealStack(t, stackOpts{})
	for _, tc := range []struct {
		path, body, code string
		status           int
	}{
		{"/v1/completions", `{"prompt":5}`, codeInvalidField, 400},
		{"/v1/completions", `{"prompt":"ab"}`, codeInvalidPrompt, 400},
		{"/v1/completions", `{"prompt":"平安","n":"x"}`, codeInvalidField, 400},
		{"/v1/chat/completions", `{"messages":[{"role":"system","content":"hi"}]}`, codeInvalidPrompt, 400},
		{"/v1/chat/completions", `{"messages":"平安"}`, codeInvalidField, 400},
	} {
		code, _, body := post(t, rs.base+tc.path, tc.body)
		if code != tc.status {
			t.Errorf("%s %s: status %d: %s", tc.path, tc.body, code, body)
			continue
		}
		checkError(t, body, tc.code)
	}
	if code, _, _ := get(t, rs.base+"/v1/completions"); code != 405 {
		t.Errorf("GET /v1/completions: %d", code)
	}
}

// TestOpenAIStreams checks the streamed answers of both OpenAI endpoints.
func TestOpenAIStreams(t *testing.T) {
	rs := newRealStack(t, stackOpts{})
	checkUsage := func(t *testing.T, raw json.RawMessage) {
		var u struct {
			P int `json:"prompt_tokens"`
			C int `json:"completion_tokens"`
			T int `json:"total_tokens"`
		}
		if err := json.Unmarshal(raw, &u); err != nil || u.P <= 0 || u.C <= 0 || u.T != u.P+u.C {
			t.Errorf("usage %s", raw)
		}
	}
	t.Run("completions stream", func(t *testing.T) {
		code, hdr, body := post(t, rs.base+"/v1/completions", map[string]any{"prompt": "平安", "stream": true})
		if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d", code)
		}
		_, datas := sseEvents(t, body)
		if len(datas) < 2 || datas[len(datas)-1] != "[DONE]" {
			t.Fatalf("stream does not end with [DONE]: %q", datas)
		}
		var text strings.Builder
		for i, d := range datas[:len(datas)-1] {
			var ch struct {
				Object  string
				Choices []struct {
					Text         string
					FinishReason *string `json:"finish_reason"`
				}
				Usage json.RawMessage
			}
			if err := json.Unmarshal([]byte(d), &ch); err != nil || ch.Object != "text_completion" {
				t.Fatalf("chunk %q: %v", d, err)
			}
			text.WriteString(ch.Choices[0].Text)
			if i == len(datas)-2 {
				if ch.Choices[0].FinishReason == nil || *ch.Choices[0].FinishReason != "stop" {
					t.Error("final chunk without finish_reason stop")
				}
				checkUsage(t, ch.Usage)
			} else if ch.Usage != nil {
				t.Errorf("usage before the final chunk: %s", d)
			}
		}
		checkCoupletText(t, text.String())
	})
	t.Run("chat stream", func(t *testing.T) {
		code, _, body := post(t, rs.base+"/v1/chat/completions", map[string]any{
			"messages": []map[string]any{{"role": "user", "content": "平安"}}, "stream": true, "stream_options": map[string]bool{"include_usage": true}})
		_, datas := sseEvents(t, body)
		if code != 200 || datas[len(datas)-1] != "[DONE]" {
			t.Fatalf("status %d: %q", code, datas)
		}
		var text strings.Builder
		var lastUsage json.RawMessage
		for _, d := range datas[:len(datas)-1] {
			var ch struct {
				Object  string
				Choices []struct {
					Delta struct{ Role, Content string }
				}
				Usage json.RawMessage
			}
			if err := json.Unmarshal([]byte(d), &ch); err != nil || ch.Object != "chat.completion.chunk" {
				t.Fatalf("chunk %q: %v", d, err)
			}
			text.WriteString(ch.Choices[0].Delta.Content)
			lastUsage = ch.Usage
		}
		checkCoupletText(t, text.String())
		checkUsage(t, lastUsage)
	})

}
