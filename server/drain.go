package server

// drain.go: graceful shutdown in the order a load balancer needs.
//
//  1. ctx ends (SIGTERM): /ready turns 503 but requests are still admitted
//     and served for Config.DrainDelay, so that a balancer polling /ready
//     (Kubernetes endpoints, HAProxy httpchk) takes the replica out of
//     rotation before it stops accepting.
//  2. The listener closes (new connections are refused, which every
//     balancer retries on another replica) and in-flight requests finish
//     for up to Config.DrainTimeout; new requests on kept-alive connections
//     get 503 shutting_down.
//  3. Past DrainTimeout the remaining connections are closed.
//
// Close (a second signal in `chunlian serve`) skips whatever is left.

import (
	"context"
	"errors"
	"net/http"
)

// ErrForced is returned by Serve when Close cut the drain short.
var ErrForced = errors.New("server: stopped without draining (forced)")

// Close stops a Serve in progress at once: the drain delay and the drain
// are skipped, open connections are closed (their request contexts are
// cancelled, so the engine frees their blocks) and Serve returns ErrForced.
// Safe to call more than once and before Serve.
func (s *Server) Close() { s.forceOnce.Do(func() { close(s.force) }) }

// Draining reports whether shutdown has begun (/ready 503 for that reason).
func (s *Server) Draining() bool {
	st := s.state.Load()
	return st == stateLeaving || st == stateDraining
}

// drain runs steps 1–3 on hs, whose Serve goroutine reports on errc.
func (s *Server) drain(hs *http.Server, errc <-chan error) error {
	s.state.Store(stateLeaving)
	s.log.Info("draining: /ready 503, still serving", "delay", s.cfg.DrainDelay.String(), "timeout", s.cfg.DrainTimeout.String())
	if s.cfg.DrainDelay > 0 {
		select {
		case <-s.after(s.cfg.DrainDelay):
		case <-s.force:
			return s.forceClose(hs, errc)
		}
	}
	s.state.Store(stateDraining)
	s.log.Info("closing the listener, finishing in-flight requests")
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	forced := make(chan struct{})
	go func() {
		select {
		case <-s.force:
			close(forced)
			cancel()
		case <-dctx.Done():
		}
	}()
	if err := hs.Shutdown(dctx); err != nil {
		select {
		case <-forced:
			return s.forceClose(hs, errc)
		default:
		}
		s.log.Warn("drain timeout: closing remaining connections", "err", err)
		hs.Close()
	}
	<-errc // http.ErrServerClosed
	s.log.Info("stopped")
	return nil
}

func (s *Server) forceClose(hs *http.Server, errc <-chan error) error {
	s.state.Store(stateDraining)
	s.log.Warn("forced stop: closing all connections without draining")
	hs.Close()
	<-errc
	return ErrForced
}
