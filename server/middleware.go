package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"
)

type ctxKey int

const (
	keyRequestID ctxKey = iota
	keyUsage
)

// requestID returns the request's id (set by the middleware).
func requestID(ctx context.Context) string {
	id, _ := ctx.Value(keyRequestID).(string)
	return id
}

// validRequestID accepts a client-sent X-Request-ID of 1..128 visible ASCII
// characters; anything else is replaced so logs stay clean.
func validRequestID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// statusWriter records the status and size for the access log. It passes
// Flush through so streaming works. Before every write it renews the
// connection's write deadline (writeTimeout); the first failed write or
// flush (a client gone or not reading) cancels the request's context, so
// the generation behind it stops and frees its slot.
type statusWriter struct {
	http.ResponseWriter
	status       int
	bytes        int64
	writeTimeout time.Duration
	cancel       context.CancelFunc
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	extendWriteDeadline(w.ResponseWriter, w.writeTimeout)
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	if err != nil && w.cancel != nil {
		w.cancel()
	}
	return n, err
}

func (w *statusWriter) Flush() {
	extendWriteDeadline(w.ResponseWriter, w.writeTimeout)
	err := http.NewResponseController(w.ResponseWriter).Flush()
	if err != nil && !errors.Is(err, http.ErrNotSupported) && w.cancel != nil {
		w.cancel()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// withRequestLog assigns the request id (echoed as X-Request-ID), logs one
// structured line per request and counts it in metrics. It is the outermost
// middleware so it also sees the 500s written by withRecover.
func (s *Server) withRequestLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-ID")
		if !validRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set("X-Request-ID", id)
		ctx, cancel := context.WithCancel(context.WithValue(r.Context(), keyRequestID, id))
		defer cancel()
		r = r.WithContext(ctx)
		sw := &statusWriter{ResponseWriter: w, writeTimeout: s.cfg.WriteTimeout, cancel: cancel}
		t0 := time.Now()
		next.ServeHTTP(sw, r)
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		d := time.Since(t0)
		path := routeLabel(r.URL.Path)
		s.metrics.observeHTTP(path, sw.status, d)
		lvl := slog.LevelInfo
		switch {
		case path == "/health" || path == "/ready" || path == "/metrics" || path == "/api/stats" || path == "static":
			lvl = slog.LevelDebug // polled endpoints (503 from /ready is normal) would drown the log
		case sw.status >= 500 && sw.status != http.StatusServiceUnavailable:
			lvl = slog.LevelWarn // 503 is load shedding, not a fault
		}
		s.log.LogAttrs(r.Context(), lvl, "http",
			slog.String("request_id", id),
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.Int("status", sw.status),
			slog.Int64("bytes", sw.bytes),
			slog.Float64("ms", float64(d.Microseconds())/1000),
			slog.String("remote", r.RemoteAddr))
	})
}

// withRecover turns a handler panic into a 500 JSON error (if nothing was
// written yet) and a logged stack; the server keeps running.
// http.ErrAbortHandler is re-raised: it is net/http's way to abort a response.
func (s *Server) withRecover(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.metrics.panics.Inc()
			s.log.Error("handler panic", "request_id", requestID(r.Context()), "panic", v, "stack", string(debug.Stack()))
			if sw, ok := w.(*statusWriter); ok && sw.status != 0 {
				return // headers already sent; the client sees a truncated body
			}
			writeError(w, errf(http.StatusInternalServerError, codeInternal, "内部错误", "internal server error"))
		}()
		next.ServeHTTP(w, r)
	})
}

// withCORS adds CORS headers for allowed origins and answers preflights.
// With no origins configured it is the identity.
func (s *Server) withCORS(next http.Handler) http.Handler {
	if len(s.cfg.CORSOrigins) == 0 {
		return next
	}
	allowed := func(o string) bool {
		for _, a := range s.cfg.CORSOrigins {
			if a == "*" || strings.EqualFold(a, o) {
				return true
			}
		}
		return false
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		w.Header().Add("Vary", "Origin") // answers differ by Origin: caches must know
		if origin != "" && allowed(origin) {
			h := w.Header()
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Expose-Headers", "X-Request-ID, Retry-After")
			if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
				h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
				h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-ID")
				h.Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// requireKey guards an API handler with the bearer key (when configured).
// The comparison is constant-time.
func (s *Server) requireKey(next http.HandlerFunc) http.HandlerFunc {
	if s.cfg.APIKey == "" {
		return next
	}
	want := []byte("Bearer " + s.cfg.APIKey)
	return func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="chunlian"`)
			writeError(w, errf(http.StatusUnauthorized, codeUnauthorized, "需要有效的 API 密钥（Authorization: Bearer …）", "a valid API key is required (Authorization: Bearer …)"))
			return
		}
		next(w, r)
	}
}

// methods answers 405 with a JSON error (and Allow) for other methods.
// HEAD is accepted wherever GET is.
func methods(h http.HandlerFunc, allowed ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for _, m := range allowed {
			if r.Method == m || (m == http.MethodGet && r.Method == http.MethodHead) {
				h(w, r)
				return
			}
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, errf(http.StatusMethodNotAllowed, codeMethod, "不支持的请求方法 %s", "method %s not allowed", r.Method, r.Method))
	}
}

// routeLabel bounds the metric label's cardinality to known routes.
func routeLabel(p string) string {
	switch p {
	case "/", "/dashboard", "/generate", "/health", "/ready", "/metrics", "/api/stats",
		"/v1/models", "/v1/completions", "/v1/chat/completions":
		return p
	}
	if strings.HasPrefix(p, "/static/") || p == "/favicon.ico" {
		return "static"
	}
	return "other"
}
