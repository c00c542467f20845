package provider_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/smsstub"
)

// BenchmarkClientSend is one provider attempt end to end over loopback
// HTTP/1.1 with keep-alive: build the request, send it, read and classify
// the answer. The servers answer at once, so the figure is the client's
// and the transport's cost per call (and the stub's, for "smsstub").
//
//	go test ./internal/provider -run '^$' -bench ClientSend -cpuprofile provider.pprof
func BenchmarkClientSend(b *testing.B) {
	accepted := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"msg_9f3a0c1d2e","to":"+15551234567","status":"queued"}`)
	}
	unavailable := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"code":30008,"message":"try again later"}`)
	}
	stub, err := smsstub.New(smsstub.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stub.Close() })

	cases := []struct {
		name     string
		handler  http.Handler
		want     provider.Kind
		parallel bool
	}{
		{"201", http.HandlerFunc(accepted), provider.Sent, false},
		{"503-retry-after", http.HandlerFunc(unavailable), provider.Retry, false},
		{"smsstub", stub.Handler(), provider.Sent, false},
		{"201-parallel", http.HandlerFunc(accepted), provider.Sent, true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			srv := httptest.NewServer(tc.handler)
			b.Cleanup(srv.Close)
			c, err := provider.New(provider.Config{BaseURL: srv.URL, Idempotent: true, MaxConns: 32})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			send := func() {
				m := provider.Message{Key: uuid.NewString(), To: "+15551234567", Body: "Your code is 482901"}
				if o := c.Send(ctx, m); o.Kind != tc.want {
					b.Errorf("outcome %v (%s), want %v", o.Kind, o.Reason, tc.want)
				}
			}
			if tc.parallel {
				// 32 calls in flight on two cores, like a sender at its
				// default concurrency.
				b.SetParallelism(16)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						send()
					}
				})
			} else {
				for b.Loop() {
					send()
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
	}
}
