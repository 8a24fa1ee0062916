package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"chunlian/couplet"
)

// BenchmarkHTTPOverhead measures the HTTP layer alone (middleware, JSON
// decode/validate/encode, stats, metrics) around a generator that answers at
// once, over real loopback connections with parallel clients. It bounds what
// the service can add per couplet at high QPS.
func BenchmarkHTTPOverhead(b *testing.B) {
	benchPost(b, instantServer(b)+"/generate", `{"prompt":"平安","seed":3}`)
}

// instantServer serves a generator that answers at once, warmed up; it
// returns the base URL.
func instantServer(b *testing.B) string {
	srv, err := New(Config{Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	srv.Attach(Backend{Generator: fakeGen{func(context.Context, couplet.Request) ([]couplet.Couplet, error) {
		return []couplet.Couplet{fakeCouplet}, nil
	}}})
	if err := srv.Warmup(context.Background()); err != nil {
		b.Fatal(err)
	}
	return newHTTPTest(b, srv)
}

// BenchmarkHTTPOneClient is BenchmarkHTTPOverhead with one client sending
// a request at a time: what the HTTP layer adds to a single couplet's
// latency (ns/op).
func BenchmarkHTTPOneClient(b *testing.B) {
	url := instantServer(b) + "/generate"
	client := &http.Client{}
	for b.Loop() {
		if err := postOK(client, url, `{"prompt":"平安","seed":3}`); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGenerateRandomModel is one couplet per op through HTTP on the
// real stack (random test model, CPU backend), parallel clients.
func BenchmarkGenerateRandomModel(b *testing.B) {
	rs := newRealStack(b, stackOpts{})
	benchPost(b, rs.base+"/generate", `{"prompt":"平安"}`)
}

func benchPost(b *testing.B, url, body string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := postOK(client, url, body); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// postOK posts a JSON body to url and reads the answer to its end; an
// error unless the status is 200.
func postOK(client *http.Client, url, body string) error {
	res, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		return fmt.Errorf("status %d", res.StatusCode)
	}
	return nil
}
