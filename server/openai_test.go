package server

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"chunlian/couplet"
)

func TestChatIntent(t *testing.T) {
	for _, tc := range []struct {
		in         string
		mode       couplet.Mode
		prompt     string
		wantReject bool
	}{
		{"平安", couplet.ModeKeyword, "平安", false},
		{"春回大地千山秀", couplet.ModeLower, "春回大地千山秀", false},
		{"请给我写一副关于平安的春联", couplet.ModeKeyword, "平安", false},
		{"以吉祥为主题写一副春联", couplet.ModeKeyword, "吉祥", false},
		{"帮我写一副春联，主题是富贵", couplet.ModeKeyword, "富贵", false},
		{"写一副带“如意”的对联", couplet.ModeKeyword, "如意", false},
		{"写一副藏头联，藏“平安”", couplet.ModeAcrostic, "平安", false},
		{"请写藏头春联：吉祥", couplet.ModeAcrostic, "吉祥", false},
		{"上联：春回大地千山秀，请对下联", couplet.ModeLower, "春回大地千山秀", false},
		{"上联是春回大地千山秀，下联是什么", couplet.ModeLower, "春回大地千山秀", false},
		{"请对下联：上联：天增岁月人增寿", couplet.ModeLower, "天增岁月人增寿", false},
		{"给我写一副心想事成的春联", couplet.ModeKeyword, "心想事成", false},
		{"来一副吉祥春联", couplet.ModeKeyword, "吉祥", false},
		{"写一副关于福的春联", couplet.ModeKeyword, "福", false},
		{"新年春联", couplet.ModeKeyword, "新年", false},
		{"写一副带“万事如意”的对联", couplet.ModeKeyword, "万事如意", false},
		{"用平安藏头写一副对联", couplet.ModeAcrostic, "平安", false},
		{"平安藏头", couplet.ModeAcrostic, "平安", false},
		{"写一副好的春联", "", "", true},
		{"来一副七字对联", "", "", true},
		{"给我写一副春联", "", "", true},
		{"请写一副藏头联", "", "", true},
		{"帮我对个下联", "", "", true},
	} {
		mode, prompt, e := chatIntent(couplet.Normalize(tc.in), "")
		if tc.wantReject {
			if e == nil || e.Status != 400 || e.Param == nil || *e.Param != "messages" {
				t.Errorf("%q: got %q %q %v, want a 400 on messages", tc.in, mode, prompt, e)
			}
			continue
		}
		if e != nil || mode != tc.mode || prompt != tc.prompt {
			t.Errorf("%q: got mode %q prompt %q err %v, want %q %q", tc.in, mode, prompt, e, tc.mode, tc.prompt)
		}
	}
}

// captureServer is a fake server that records the last couplet request.
func captureServer(t *testing.T, cfg Config) (string, func() couplet.Request) {
	var mu sync.Mutex
	var last couplet.Request
	_, base := newFakeServer(t, cfg, func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		mu.Lock()
		last = req
		mu.Unlock()
		return []couplet.Couplet{fakeCouplet}, nil
	})
	return base, func() couplet.Request { mu.Lock(); defer mu.Unlock(); return last }
}

// Every interface normalises the same way: zero-width characters are
// stripped (not a switch to lower mode on one endpoint and a 400 on
// another), traditional characters are simplified.
func TestInputNormalisedEverywhere(t *testing.T) {
	base, last := captureServer(t, Config{})
	for _, in := range []string{"平\u200b安", "\u200b平安\ufeff", " 平安 ", "平安。"} {
		for _, ep := range []struct{ path, body string }{
			{"/generate", `{"prompt":%s}`},
			{"/v1/completions", `{"prompt":%s}`},
			{"/v1/chat/completions", `{"messages":[{"role":"user","content":%s}]}`},
		} {
			js, _ := json.Marshal(in)
			code, _, b := post(t, base+ep.path, strings.Replace(ep.body, "%s", string(js), 1))
			if code != 200 {
				t.Errorf("%s %q: %d %s", ep.path, in, code, b)
				continue
			}
			if r := last(); r.Mode != couplet.ModeKeyword || r.Text != "平安" {
				t.Errorf("%s %q: mode %q text %q, want keyword 平安", ep.path, in, r.Mode, r.Text)
			}
		}
	}
	for _, path := range []string{"/generate", "/v1/completions"} {
		if code, _, b := post(t, base+path, `{"prompt":"福壽"}`); code != 200 || last().Text != "福寿" {
			t.Errorf("%s 福壽: %d %s, text %q", path, code, b, last().Text)
		}
	}
}

// errorShape decodes an OpenAI-shaped error.
type oaErr struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func checkOAError(t *testing.T, what string, body []byte, typ, param, code string) {
	t.Helper()
	var e oaErr
	raw := map[string]map[string]any{}
	if json.Unmarshal(body, &e) != nil || json.Unmarshal(body, &raw) != nil {
		t.Fatalf("%s: body %s", what, body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("%s: error has no %q: %s", what, k, body)
		}
	}
	if e.Error.Type != typ || e.Error.Code != code || (param == "") != (e.Error.Param == nil) || (param != "" && *e.Error.Param != param) {
		t.Errorf("%s: %s, want type %q param %q code %q", what, body, typ, param, code)
	}
}

func TestOpenAIConformanceDetails(t *testing.T) {
	base, _ := captureServer(t, Config{})
	for _, tc := range []struct {
		path, body       string
		status           int
		typ, param, code string
	}{
		{"/v1/completions", `{"model":"gpt-4","prompt":"平安"}`, 404, "not_found_error", "model", codeModelNotFound},
		{"/v1/chat/completions", `{"model":"gpt-4","messages":[{"role":"user","content":"平安"}]}`, 404, "not_found_error", "model", codeModelNotFound},
		{"/v1/completions", `{"prompt":"平安","stop":["\n"]}`, 400, "invalid_request_error", "stop", codeUnsupported},
		{"/v1/completions", `{"prompt":"平安","stop":"。"}`, 400, "invalid_request_error", "stop", codeUnsupported},
		{"/v1/completions", `{"prompt":"平安","logprobs":1}`, 400, "invalid_request_error", "logprobs", codeUnsupported},
		{"/v1/completions", `{"prompt":"平安","echo":true}`, 400, "invalid_request_error", "echo", codeUnsupported},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"平安"}],"logprobs":true}`, 400, "invalid_request_error", "logprobs", codeUnsupported},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"平安"}],"top_logprobs":2}`, 400, "invalid_request_error", "top_logprobs", codeUnsupported},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"平安"}],"stop":["x"],"stream":true}`, 400, "invalid_request_error", "stop", codeUnsupported},
		{"/v1/completions", `{"prompt":"平安","n":1000}`, 400, "invalid_request_error", "n", codeInvalidField},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"给我写一副春联"}]}`, 400, "invalid_request_error", "messages", codeInvalidPrompt},
	} {
		code, _, b := post(t, base+tc.path, tc.body)
		if code != tc.status {
			t.Errorf("%s %s: %d, want %d: %s", tc.path, tc.body, code, tc.status, b)
			continue
		}
		checkOAError(t, tc.path+" "+tc.body, b, tc.typ, tc.param, tc.code)
	}
	// Accepted "nothing" values of the unsupported fields.
	for _, body := range []string{`{"prompt":"平安","stop":null,"logprobs":null,"echo":false}`, `{"prompt":"平安","stop":[]}`, `{"model":"fake","prompt":"平安"}`} {
		if code, _, b := post(t, base+"/v1/completions", body); code != 200 {
			t.Errorf("%s: %d %s", body, code, b)
		}
	}
	code, _, b := get(t, base+"/v1/models/fake")
	var m struct{ ID, Object string }
	if code != 200 || json.Unmarshal(b, &m) != nil || m.ID != "fake" || m.Object != "model" {
		t.Errorf("/v1/models/fake: %d %s", code, b)
	}
	code, _, b = get(t, base+"/v1/models/gpt-4")
	if code != 404 {
		t.Errorf("/v1/models/gpt-4: %d %s", code, b)
	}
	checkOAError(t, "/v1/models/gpt-4", b, "not_found_error", "model", codeModelNotFound)
}

// On the real stack: max_model_len is the model's, a streamed request with
// input the generator rejects gets the 400 (not 200 + error), and a stream
// carries tokens as they are decoded before the answer's text.
func TestOpenAIRealStack(t *testing.T) {
	rs := newRealStack(t, stackOpts{})
	b := rs.srv.backend.Load()
	b2 := *b
	b2.MaxModelLen = testModel().Config.MaxPositions
	rs.srv.Attach(b2)
	code, _, body := get(t, rs.base+"/v1/models")
	var ms struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		}
	}
	if code != 200 || json.Unmarshal(body, &ms) != nil || len(ms.Data) != 1 || ms.Data[0].MaxModelLen != testModel().Config.MaxPositions {
		t.Errorf("/v1/models: %d %s, want max_model_len %d", code, body, testModel().Config.MaxPositions)
	}
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		body := `{"prompt":"平安","length":32,"stream":true}`
		if strings.Contains(path, "chat") {
			body = `{"messages":[{"role":"user","content":"平安"}],"length":32,"stream":true}`
		}
		code, hdr, b := post(t, rs.base+path, body)
		if code != 400 || strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
			t.Errorf("%s streamed length 32: %d %q %s", path, code, hdr.Get("Content-Type"), b)
		} else {
			checkOAError(t, path, b, "invalid_request_error", "length", couplet.CodeBadLength)
		}
	}
	code, _, body = post(t, rs.base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"请给我写一副关于平安的春联"}],"stream":true,"seed":5}`)
	_, datas := sseEvents(t, body)
	if code != 200 || len(datas) < 3 || datas[len(datas)-1] != "[DONE]" {
		t.Fatalf("chat stream: %d %q", code, datas)
	}
	tokens, textAt := 0, -1
	var text strings.Builder
	for i, d := range datas[:len(datas)-1] {
		var ch struct {
			Choices []struct{ Delta struct{ Content string } }
			Token   *tokenEventJSON `json:"chunlian_token"`
		}
		if err := json.Unmarshal([]byte(d), &ch); err != nil {
			t.Fatal(err)
		}
		if ch.Token != nil {
			tokens++
			if textAt >= 0 {
				t.Errorf("token chunk after the text began: %s", d)
			}
		}
		if ch.Choices[0].Delta.Content != "" && textAt < 0 {
			textAt = i
		}
		text.WriteString(ch.Choices[0].Delta.Content)
	}
	if tokens == 0 {
		t.Error("no token chunks while generating")
	}
	checkCoupletText(t, text.String())
}
