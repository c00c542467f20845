// Package console serves the operator console of sendonce (relay console):
// a few server-rendered pages over the outbox and the dead letters, for
// people who would rather look than read. The overview shows rows by status,
// the relay's lag, the oldest row in flight, sends per second, dead letters
// per hour by reason and a chart of the last hour's attempts; the dead-letter
// page filters dead and unknown rows, counts them by provider code, and
// replays a selection (a dry run first, then a confirmation) by the rules of
// relay dlq replay; a message's page is its timeline. Nothing it shows holds
// a message body or a whole phone number.
//
// Users log in with a name and a password from a users file (bcrypt hashes);
// a viewer looks, an operator also replays. Every state-changing request is
// a POST carrying the session's CSRF token. Pages and assets are embedded;
// the console needs no network beyond Postgres and NATS.
//
// The data-* attributes of the pages are a contract other tools drive the
// console by: [data-status] per status on the overview, [data-id] per dead
// letter with input[name=id], [data-action=replay-preview] and
// [data-action=replay-confirm], and [data-field=status] on a message page.
package console

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/outbox"
)

// Defaults of Config.
const (
	DefaultSessionTTL = 12 * time.Hour
	DefaultRefresh    = 5 * time.Second
	DefaultExactBelow = 100_000
	DefaultPageSize   = 200
	// DefaultMaxSessions and DefaultMaxSessionsPerUser bound the
	// sessions kept in memory (about 300 bytes each).
	DefaultMaxSessions        = 10_000
	DefaultMaxSessionsPerUser = 10
	// DefaultLoginRate and DefaultLoginBurst budget the password checks
	// of one client address: 10 at once, then one every 2 s.
	DefaultLoginRate  = 0.5
	DefaultLoginBurst = 10
	// DefaultLoginTotalRate and DefaultLoginTotalBurst budget those of
	// every client together: 20 at once, then 5 a second, about a third
	// of a core at bcrypt cost 10 (some 60 ms a check).
	DefaultLoginTotalRate  = 5
	DefaultLoginTotalBurst = 20
)

// Announcement starts the line relay console prints on stdout once it
// listens, followed by its URL.
const Announcement = "console listening on "

// Config configures a Console.
type Config struct {
	// Pool reads the outbox and writes replays and their audit; its role
	// needs no more than the grants of sendonce_console. Required.
	Pool *pgxpool.Pool
	// JetStream reads the dead letters (stream SMS_DLQ). Required.
	JetStream jetstream.JetStream
	// Users are who may log in. Required, at least one.
	Users []User
	// Logger receives logins, replays and failures; default: discarded.
	Logger *slog.Logger
	// DBTimeout bounds the database and NATS work of one request; default
	// outbox.DefaultDBTimeout.
	DBTimeout time.Duration
	// SessionTTL is how long a login lasts; default DefaultSessionTTL.
	SessionTTL time.Duration
	// SecureCookie marks the session cookie Secure, for a console reached
	// over HTTPS through a proxy; a request that arrives over TLS gets a
	// Secure cookie anyway.
	SecureCookie bool
	// Refresh is how often the overview refreshes itself; default
	// DefaultRefresh.
	Refresh time.Duration
	// ExactBelow is the table size (by the statistics) under which the
	// overview counts every status exactly; above it, the bulk statuses
	// (sent and later) are estimates. Default DefaultExactBelow.
	ExactBelow int64
	// PageSize is how many dead letters (or suppression-list entries) a
	// page lists, and a bound of one replay's selection; default
	// DefaultPageSize.
	PageSize int
	// TrustedProxies are the proxies (addresses and prefixes) whose
	// X-Forwarded-For names the client: for a request from one of them,
	// the client is the right-most address of that header that is not a
	// trusted proxy. Without them the client is the direct peer, and the
	// header is ignored.
	TrustedProxies []netip.Prefix
	// MaxSessions bounds the sessions kept at once: past it, a login ends
	// the oldest session of the user who holds the most; default
	// DefaultMaxSessions.
	MaxSessions int
	// MaxSessionsPerUser bounds one user's sessions: past it, the user's
	// login ends the user's oldest; default DefaultMaxSessionsPerUser.
	MaxSessionsPerUser int
	// LoginRate is how many password checks (bcrypt comparisons) a
	// second one client address may ask for, sustained, and LoginBurst
	// how many at once; the address is the one the failure throttle
	// counts (an IPv6 /64). A login past them is answered 429 with
	// Retry-After before its password is compared. Defaults
	// DefaultLoginRate and DefaultLoginBurst.
	LoginRate  float64
	LoginBurst int
	// LoginTotalRate and LoginTotalBurst are the same budget for every
	// client together, which bounds the CPU that logins can take
	// whatever the number of addresses they come from. Defaults
	// DefaultLoginTotalRate and DefaultLoginTotalBurst.
	LoginTotalRate  float64
	LoginTotalBurst int
}

func (c *Config) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("console: Config.Pool is required")
	case c.JetStream == nil:
		return errors.New("console: Config.JetStream is required")
	case len(c.Users) == 0:
		return errors.New("console: Config.Users: at least one user is required")
	case c.DBTimeout < 0, c.SessionTTL < 0, c.Refresh < 0, c.ExactBelow < 0, c.PageSize < 0, c.MaxSessions < 0, c.MaxSessionsPerUser < 0:
		return errors.New("console: Config: durations and sizes must not be negative")
	case c.LoginRate < 0 || math.IsNaN(c.LoginRate) || math.IsInf(c.LoginRate, 0):
		return errors.New("console: Config.LoginRate must be a positive number (0: the default)")
	case c.LoginBurst < 0:
		return errors.New("console: Config.LoginBurst must not be negative (0: the default)")
	case c.LoginTotalRate < 0 || math.IsNaN(c.LoginTotalRate) || math.IsInf(c.LoginTotalRate, 0):
		return errors.New("console: Config.LoginTotalRate must be a positive number (0: the default)")
	case c.LoginTotalBurst < 0:
		return errors.New("console: Config.LoginTotalBurst must not be negative (0: the default)")
	}
	return nil
}

// Console serves the pages.
type Console struct {
	cfg      Config
	log      *slog.Logger
	users    map[string]User
	dummy    []byte
	sessions *sessions
	limiter  *limiter
	budget   *budget
	pages    map[string]*template.Template
	handler  http.Handler
	now      func() time.Time
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New checks cfg and builds a Console.
func New(cfg Config) (*Console, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, outbox.DefaultDBTimeout)
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, DefaultSessionTTL)
	cfg.Refresh = cmp.Or(cfg.Refresh, DefaultRefresh)
	cfg.ExactBelow = cmp.Or(cfg.ExactBelow, DefaultExactBelow)
	cfg.PageSize = cmp.Or(cfg.PageSize, DefaultPageSize)
	cfg.MaxSessions = cmp.Or(cfg.MaxSessions, DefaultMaxSessions)
	cfg.MaxSessionsPerUser = cmp.Or(cfg.MaxSessionsPerUser, DefaultMaxSessionsPerUser)
	cfg.LoginRate = cmp.Or(cfg.LoginRate, DefaultLoginRate)
	cfg.LoginBurst = cmp.Or(cfg.LoginBurst, DefaultLoginBurst)
	cfg.LoginTotalRate = cmp.Or(cfg.LoginTotalRate, DefaultLoginTotalRate)
	cfg.LoginTotalBurst = cmp.Or(cfg.LoginTotalBurst, DefaultLoginTotalBurst)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c := &Console{
		cfg: cfg, log: log.With("component", "console"), users: map[string]User{},
		sessions: newSessions(cfg.SessionTTL, cfg.MaxSessions, cfg.MaxSessionsPerUser), limiter: newLimiter(),
		budget: newBudget(cfg.LoginRate, cfg.LoginBurst, cfg.LoginTotalRate, cfg.LoginTotalBurst), now: time.Now,
	}
	for _, u := range cfg.Users {
		c.users[u.Name] = u
	}
	c.dummy = dummyHash(cfg.Users)
	var err error
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	c.handler = c.routes()
	return c, nil
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"login", "overview", "deadletters", "replay", "message", "search", "suppressions", "error"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

func (c *Console) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", cacheStatic(http.FileServerFS(static))))
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.login)
	mux.HandleFunc("POST /logout", c.authed(c.logout))
	mux.HandleFunc("POST /logout/others", c.authed(c.logoutOthers))
	mux.HandleFunc("GET /{$}", c.authed(c.overview))
	mux.HandleFunc("GET /dead-letters", c.authed(c.deadLetters))
	mux.HandleFunc("POST /dead-letters/replay", c.authed(c.operator(c.replay)))
	mux.HandleFunc("GET /messages", c.authed(c.search))
	mux.HandleFunc("GET /messages/{id}", c.authed(c.message))
	mux.HandleFunc("GET /suppressions", c.authed(c.suppressions))
	mux.HandleFunc("POST /suppressions/check", c.authed(c.suppressionCheck))
	mux.HandleFunc("POST /suppressions/add", c.authed(c.operator(c.suppressionChange(false))))
	mux.HandleFunc("POST /suppressions/remove", c.authed(c.operator(c.suppressionChange(true))))
	mux.HandleFunc("/", c.authed(func(w http.ResponseWriter, r *http.Request, s *session) {
		c.fail(w, r, s, http.StatusNotFound, "No such page.")
	}))
	return secureHeaders(mux)
}

// Handler returns the console's HTTP handler.
func (c *Console) Handler() http.Handler { return c.handler }

// Serve serves the console on ln until ctx ends, then lets requests in
// progress finish for up to 10 seconds.
func (c *Console) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           c.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      c.cfg.DBTimeout + 30*time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(c.log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("console: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("console: shutdown: %w", err)
	}
	return nil
}

// secureHeaders sets what every answer carries: nothing from elsewhere may
// run, frame or style the pages, and pages are not cached.
func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

func cacheStatic(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "private, max-age=300")
		next.ServeHTTP(w, r)
	})
}

// page is what the layout needs beside a page's own data.
type page struct {
	Title   string
	Nav     string
	User    *User
	CSRF    string
	Refresh int
	Data    any
}

// render executes a page into a buffer first, so a template error never
// leaves half a page.
func (c *Console) render(w http.ResponseWriter, status int, name string, p page) {
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		c.log.Error("console: render page", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// pageFor fills the layout's part of a page for a session.
func pageFor(s *session, title, nav string, data any) page {
	p := page{Title: title, Nav: nav, Data: data}
	if s != nil {
		u := s.user
		p.User, p.CSRF = &u, s.csrf
	}
	return p
}

// errorView is an error page's data.
type errorView struct {
	Status  int
	Message string
}

// fail answers with an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, msg string) {
	c.render(w, status, "error", pageFor(s, http.StatusText(status), "", errorView{Status: status, Message: msg}))
}

// internal logs err and answers 500 without its text, which could quote
// what the user typed.
func (c *Console) internal(w http.ResponseWriter, r *http.Request, s *session, what string, err error) {
	c.log.ErrorContext(r.Context(), "console: "+what, "err", err, "path", r.URL.Path)
	c.fail(w, r, s, http.StatusInternalServerError, "Could not "+what+"; the console's log has the cause.")
}
