// Package telemetry provides the operational surface of the sendonce
// processes: structured logs, the HTTP endpoints /metrics, /healthz and
// /readyz, the build-info and dependency gauges, and the progress records
// that readiness is decided from.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewLogger returns a JSON (format "json") or text (format "text") logger
// writing to w at level ("debug", "info", "warn" or "error").
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationText}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}

// durationText writes durations as "1.5s" rather than JSON's nanoseconds.
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// NewRegistry returns a registry with the Go runtime and process collectors
// and sendonce_build_info.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), BuildInfo())
	return reg
}

// Server serves /metrics, /healthz and /readyz.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// ReadyCache is how long /readyz reuses a readiness result: probes from
// several sources (the orchestrator, a load balancer, a person) then cost
// one check per second between them, whatever their number.
const ReadyCache = time.Second

// Listen binds addr and returns a server ready to Serve. ready is called by
// /readyz with a bounded context, at most once per ReadyCache; nil means
// always ready. It should decide from the process's own state (connections
// up, recent progress: see Activity), not by calling shared services.
// /readyz answers "ready" or "not ready" and nothing more (the reason may
// name a user, a host, a port): the reason goes to log, with credentials
// scrubbed, each time it changes. /healthz is liveness: it answers as long
// as the process serves HTTP. The server bounds each request's reading,
// writing and idling, so that a slow or idle client holds no connection
// for long.
func Listen(addr string, gatherer prometheus.Gatherer, ready func(context.Context) error, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	rc := &readyCache{ready: ready, log: log}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !rc.ok(r.Context(), time.Now()) {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return &Server{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second, // a scrape of a large registry
			IdleTimeout:       60 * time.Second,
			MaxHeaderBytes:    16 << 10,
		},
		ln: ln,
	}, nil
}

// readyCache runs the readiness check at most once per ReadyCache, one
// probe at a time: the others wait for its result.
type readyCache struct {
	ready func(context.Context) error
	log   *slog.Logger

	mu     sync.Mutex
	at     time.Time
	result bool
	reason string // the last reason logged, "" when ready
}

func (c *readyCache) ok(ctx context.Context, now time.Time) bool {
	if c.ready == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && now.Sub(c.at) < ReadyCache {
		return c.result
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err := c.ready(ctx)
	c.at, c.result = time.Now(), err == nil
	reason := ""
	if err != nil {
		reason = ScrubCredentials(err.Error())
	}
	if reason != c.reason {
		if reason == "" {
			c.log.Info("ready")
		} else {
			c.log.Warn("not ready", "reason", reason)
		}
		c.reason = reason
	}
	return c.result
}

var (
	urlPassword = regexp.MustCompile(`(://[^:/?#@\s]*):[^@\s]*@`)
	kvPassword  = regexp.MustCompile(`(?i)\b(password|passwd|token|secret)(\s*=\s*)('[^']*'|\S+)`)
)

// ScrubCredentials masks what looks like a credential in s: the password
// of a URL's user (scheme://user:password@) and key=value pairs whose key
// is a password, token or secret.
func ScrubCredentials(s string) string {
	s = urlPassword.ReplaceAllString(s, "${1}:xxxxx@")
	return kvPassword.ReplaceAllString(s, "${1}${2}xxxxx")
}

// Addr returns the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until Shutdown.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the server within ctx.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Start binds addr, serves in the background (a serving error is logged) and
// returns the function that shuts the server down within 5 s.
func Start(addr string, gatherer prometheus.Gatherer, ready func(context.Context) error, log *slog.Logger) (stop func(), err error) {
	srv, err := Listen(addr, gatherer, ready, log)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := srv.Serve(); err != nil {
			log.Error("http server failed", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
