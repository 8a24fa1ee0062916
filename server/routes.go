package server

import (
	"embed"
	"io/fs"
	"net/http"
	"net/http/pprof"
	"strings"
)

// web holds the page, the dashboard and the vendored uPlot; everything is
// served from the binary, so the product works offline (no CDN).
//
//go:embed web
var web embed.FS

// routes builds the mux and wraps it in the middleware chain:
// request log (id, access log, metrics, write deadlines) → recover →
// security headers → probe-only reserve connections → CORS → mux.
// API handlers are additionally wrapped by requireKey.
func (s *Server) routes() http.Handler {
	static, err := fs.Sub(web, "web")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory exists
	}
	files := http.StripPrefix("/static/", http.FileServerFS(static))
	page := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "no-cache")
			http.ServeFileFS(w, r, static, name)
		}
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/generate", methods(s.requireKey(s.handleGenerate), http.MethodPost))
	mux.HandleFunc("/v1/completions", methods(s.requireKey(s.handleCompletions), http.MethodPost))
	mux.HandleFunc("/v1/chat/completions", methods(s.requireKey(s.handleChat), http.MethodPost))
	mux.HandleFunc("/v1/models", methods(s.requireKey(s.handleModels), http.MethodGet))
	mux.HandleFunc("/v1/models/{id...}", methods(s.requireKey(s.handleModel), http.MethodGet))
	mux.HandleFunc("/health", methods(s.handleHealth, http.MethodGet))
	mux.HandleFunc("/ready", methods(s.handleReady, http.MethodGet))
	// Operational data needs the key too (unless PublicMetrics): it reveals
	// traffic and internals.
	opsKey := s.requireKey
	if s.cfg.PublicMetrics {
		opsKey = func(h http.HandlerFunc) http.HandlerFunc { return h }
	}
	mux.Handle("/metrics", methods(opsKey(s.metrics.Handler().ServeHTTP), http.MethodGet))
	mux.HandleFunc("/api/stats", methods(opsKey(s.handleStats), http.MethodGet))
	mux.HandleFunc("/dashboard", methods(page("dashboard.html"), http.MethodGet))
	mux.Handle("/static/", methods(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") { // no directory listings
			writeError(w, errf(http.StatusNotFound, codeNotFound, "找不到 %s", "%s not found", r.URL.Path, r.URL.Path))
			return
		}
		files.ServeHTTP(w, r)
	}, http.MethodGet))
	if s.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", s.requireKey(pprof.Index))
		mux.HandleFunc("/debug/pprof/cmdline", s.requireKey(pprof.Cmdline))
		mux.HandleFunc("/debug/pprof/profile", s.requireKey(pprof.Profile))
		mux.HandleFunc("/debug/pprof/symbol", s.requireKey(pprof.Symbol))
		mux.HandleFunc("/debug/pprof/trace", s.requireKey(pprof.Trace))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			writeError(w, errf(http.StatusNotFound, codeNotFound, "找不到 %s", "%s not found", r.URL.Path, r.URL.Path))
			return
		}
		methods(page("index.html"), http.MethodGet)(w, r)
	})
	return s.withRequestLog(s.withRecover(withSecurityHeaders(s.withProbeReserve(s.withCORS(mux)))))
}

// handleHealth is liveness: the process serves HTTP.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// handleReady is readiness: 200 only when the model is loaded and warmed up
// and the server is not draining.
func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	switch s.state.Load() {
	case stateReady:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	case stateLeaving, stateDraining:
		w.Header().Set("Retry-After", "5")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
	default:
		w.Header().Set("Retry-After", "2")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "loading"})
	}
}
