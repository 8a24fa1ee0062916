package server

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// Connection cap. The listener accepts at most MaxConns+ProbeReserve
// connections; those accepted while MaxConns are already open are "reserve"
// connections, which may only ask /health and /ready (anything else gets 503
// and the connection is closed). So a flood of clients can exhaust the
// ordinary slots without locking out a balancer's probes, and the process
// never runs out of file descriptors from HTTP alone.

type connKind int

const connReserveKey connKind = 0

// limitListener is a net.Listener with the cap above. Accept blocks while
// all MaxConns+reserve slots are taken (as golang.org/x/net/netutil does),
// leaving further clients in the kernel's backlog.
type limitListener struct {
	net.Listener
	max, reserve int
	mu           sync.Mutex
	open         int
	free         chan struct{} // signalled when a connection closes
}

func newLimitListener(ln net.Listener, max, reserve int) *limitListener {
	return &limitListener{Listener: ln, max: max, reserve: reserve, free: make(chan struct{}, 1)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.open < l.max+l.reserve {
			l.open++
			reserve := l.open > l.max
			l.mu.Unlock()
			c, err := l.Listener.Accept()
			if err != nil {
				l.release()
				return nil, err
			}
			return &limitConn{Conn: c, l: l, reserve: reserve}, nil
		}
		l.mu.Unlock()
		<-l.free
	}
}

func (l *limitListener) release() {
	l.mu.Lock()
	l.open--
	l.mu.Unlock()
	select {
	case l.free <- struct{}{}:
	default:
	}
}

// limitConn gives its slot back exactly once, on Close.
type limitConn struct {
	net.Conn
	l       *limitListener
	reserve bool
	once    sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
	return err
}

// connContext marks requests arriving on a reserve connection (an
// http.Server ConnContext hook).
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitConn); ok && lc.reserve {
		return context.WithValue(ctx, connReserveKey, true)
	}
	return ctx
}

// withProbeReserve lets reserve connections reach only /health and /ready.
func (s *Server) withProbeReserve(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(connReserveKey) != nil && r.URL.Path != "/health" && r.URL.Path != "/ready" {
			w.Header().Set("Connection", "close")
			e := errf(http.StatusServiceUnavailable, codeOverloaded, "连接数已满，请稍后重试", "too many connections (%d), retry later", s.cfg.MaxConns, s.cfg.MaxConns)
			e.RetryAfter = 1
			s.metrics.rejected.WithLabelValues("connections").Inc()
			writeError(w, e)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// pageCSP is the Content-Security-Policy of the web page and dashboard:
// everything comes from this origin (the binary embeds it all), no inline
// script, no framing.
const pageCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// withSecurityHeaders sets headers that stop browsers from sniffing
// responses into another type or framing the pages (clickjacking).
func withSecurityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", pageCSP)
		next.ServeHTTP(w, r)
	})
}

// deadlineWriter is set on every response (see statusWriter): each write
// must complete within the write timeout, so a client that stops reading
// cannot pin a handler (and its generation slot) once the response
// outgrows the socket buffers. A long generation or stream is not cut: the
// deadline is renewed before every write.
func extendWriteDeadline(w http.ResponseWriter, d time.Duration) {
	if d > 0 {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
	}
}
