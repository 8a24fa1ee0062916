package bench

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkSummarize: cost of the per-level statistics for 100k samples.
func BenchmarkSummarize(b *testing.B) {
	ds := make([]time.Duration, 100_000) // synthetic latencies, 0–100 ms
	for i := range ds {
		ds[i] = time.Duration((i*7919)%100_000) * time.Microsecond
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = Summarize(ds)
		_ = Histogram(ds, DefaultBucketsMS)
	}
}

// BenchmarkClient measures the load generator's own ceiling: requests/s it
// can drive through HTTP against a fake service that does no work, so a
// server measured near this figure is limited by the bench, not itself.
func BenchmarkClient(b *testing.B) {
	for _, tc := range []struct {
		name   string
		api    string
		stream bool
	}{{"generate", APIGenerate, false}, {"generate-stream", APIGenerate, true}, {"openai-stream", APIOpenAI, true}} {
		b.Run(tc.name, func(b *testing.B) {
			f := &fakeService{noErrors: true, fast: true}
			srv := httptest.NewServer(f.handler())
			defer srv.Close()
			o := Options{N: 1, Stream: tc.stream}
			cl := newClient(Target{URL: srv.URL, API: tc.api}, o, 64)
			defer cl.close()
			src := newPromptSource(1, []string{"keyword"})
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if s := cl.do(context.Background(), src.next(), 10*time.Second); s.outcome != outcomeOK {
						b.Errorf("request failed: %s", s.err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}
