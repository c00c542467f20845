// Package receiver takes delivery receipts from providers and records them
// as evidence of their outbox rows: a receipt moves a row forward (to
// delivered or undelivered, or from unknown to sent), never backwards; a
// receipt for a dead row overrules it (the provider had the message).
//
// Four endpoints: POST /v1/receipts/generic (JSON, signed with
// Sendonce-Signature under a shared secret), POST /v1/receipts/twilio
// (Twilio's form-encoded status callback, signed with X-Twilio-Signature
// under the account's auth token), POST /v1/receipts/vonage (Vonage's
// Messages API status webhook, signed with a JWT under its signature
// secret), POST /v1/receipts/sinch (Sinch's SMS delivery report per
// recipient, signed with an HMAC under its callback secret) and POST
// /v1/receipts/telnyx (Telnyx's Messaging webhook, signed with Ed25519 under
// the account's key pair). Beside each, /v1/inbound/<provider> takes the
// provider's inbound messages: a recipient's opt-out keyword (STOP) puts
// the number on the suppression list, an opt-in (START) lifts it
// (inbound.go). A receipt is answered 2xx only once its effect is committed;
// receipts arriving together share one transaction (a batching window of a
// few milliseconds), so a storm of receipts does not mean a commit each.
package receiver

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	otelattr "go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/tracing"
)

// MaxBody is the largest receipt accepted, in bytes.
const MaxBody = 64 << 10

// Defaults of Config.
const (
	DefaultWindow        = 5 * time.Millisecond
	DefaultMaxBatch      = 500
	DefaultWriters       = 2
	DefaultWriteDeadline = 10 * time.Second
)

// Config configures a Receiver.
type Config struct {
	// Pool is the database pool; required.
	Pool *pgxpool.Pool
	// Secrets verify generic receipts (the first signs nothing; any may
	// match, for a rotation); none disables /v1/receipts/generic.
	Secrets [][]byte
	// TwilioToken verifies Twilio's status callbacks; empty disables
	// /v1/receipts/twilio.
	TwilioToken string
	// VonageSecret verifies Vonage's signed Messages API status webhooks
	// (its signature secret); empty disables /v1/receipts/vonage.
	VonageSecret []byte
	// SinchSecret verifies Sinch's signed SMS callbacks (the callback
	// secret); empty disables /v1/receipts/sinch.
	SinchSecret []byte
	// TelnyxPublicKey verifies Telnyx's signed Messaging webhooks (the
	// account's public key, ParseTelnyxPublicKey); empty disables
	// /v1/receipts/telnyx.
	TelnyxPublicKey ed25519.PublicKey
	// PublicURL is the receiver's base URL as the provider calls it: a
	// Twilio signature covers the full URL. Required with TwilioToken.
	PublicURL string
	// DefaultProvider names the provider whose receipts may settle rows
	// that name none (rows sent with a single SMS_PROVIDER, and rows
	// attempted before migration 0019): generic, twilio, vonage, sinch or
	// telnyx, one whose receipts this receiver verifies, or "none". Default:
	// the one provider whose receipts it verifies, when it verifies one
	// kind only; none when it verifies several.
	DefaultProvider string
	// Tolerance is how far a generic receipt's signature time may be from
	// now; default 300s.
	Tolerance time.Duration
	// Window is how long a writer waits for more receipts to share a
	// transaction with the first; default 5ms. MaxBatch bounds a batch;
	// default 500. Writers is how many transactions may be open at once;
	// default 2.
	Window   time.Duration
	MaxBatch int
	Writers  int
	// DBTimeout bounds one batch's transaction; default 10s.
	DBTimeout time.Duration
	// WriteDeadline bounds how long a receipt waits for its write (a
	// failed batch is tried again meanwhile) before it is answered 503,
	// for the provider to send it again; default 10s.
	WriteDeadline time.Duration
	// Logger receives the receiver's logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Tracing makes a span for each receipt that settles a traced row (its
	// traceparent), linked to the message's trace; nil traces nothing.
	Tracing *tracing.Tracing
}

// Receiver serves the receipt endpoints and writes receipts in batches.
type Receiver struct {
	cfg     Config
	log     *slog.Logger
	queue   chan *pending
	metrics *metrics
	// unnamed is the provider whose receipts settle rows that name none,
	// outbox.NoProvider for none.
	unnamed string
	// lastErr is the last batch's failure, nil once a batch commits: the
	// readiness.
	lastErr atomic.Pointer[error]
}

type pending struct {
	r    outbox.Receipt
	done chan written
}

type written struct {
	res outbox.ReceiptResult
	err error
}

// New returns a Receiver, or an error naming the invalid setting.
func New(cfg Config) (*Receiver, error) {
	cfg.Tolerance = cmp.Or(cfg.Tolerance, DefaultTolerance)
	cfg.Window = cmp.Or(cfg.Window, DefaultWindow)
	cfg.MaxBatch = cmp.Or(cfg.MaxBatch, DefaultMaxBatch)
	cfg.Writers = cmp.Or(cfg.Writers, DefaultWriters)
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, outbox.DefaultDBTimeout)
	cfg.WriteDeadline = cmp.Or(cfg.WriteDeadline, DefaultWriteDeadline)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("receiver: Config.Pool is required")
	case len(cfg.Secrets) == 0 && cfg.TwilioToken == "" && len(cfg.VonageSecret) == 0 && len(cfg.SinchSecret) == 0 && len(cfg.TelnyxPublicKey) == 0:
		return nil, errors.New("receiver: a generic secret, a Twilio auth token, a Vonage signature secret, a Sinch callback secret or a Telnyx public key is required")
	case len(cfg.TelnyxPublicKey) != 0 && len(cfg.TelnyxPublicKey) != ed25519.PublicKeySize:
		return nil, fmt.Errorf("receiver: a Telnyx public key is %d bytes", ed25519.PublicKeySize)
	case cfg.TwilioToken != "" && cfg.PublicURL == "":
		return nil, errors.New("receiver: PublicURL is required with a Twilio auth token (the signature covers the URL)")
	case cfg.MaxBatch < 1 || cfg.Writers < 1 || cfg.Window < 0:
		return nil, fmt.Errorf("receiver: MaxBatch %d and Writers %d must be at least 1, Window %s not negative", cfg.MaxBatch, cfg.Writers, cfg.Window)
	}
	for _, s := range cfg.Secrets {
		if len(s) < 16 {
			return nil, errors.New("receiver: a generic secret must be at least 16 bytes")
		}
	}
	unnamed, err := defaultProvider(cfg)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Receiver{
		cfg: cfg, log: cfg.Logger.With("component", "receiver"), metrics: m, unnamed: unnamed,
		queue: make(chan *pending, cfg.MaxBatch*cfg.Writers),
	}, nil
}

// sources returns the receipt sources cfg verifies, which are also the
// names of their providers.
func sources(cfg Config) []string {
	var out []string
	for _, s := range []struct {
		name string
		on   bool
	}{
		{"generic", len(cfg.Secrets) > 0}, {"twilio", cfg.TwilioToken != ""}, {"vonage", len(cfg.VonageSecret) > 0},
		{"sinch", len(cfg.SinchSecret) > 0}, {"telnyx", len(cfg.TelnyxPublicKey) > 0},
	} {
		if s.on {
			out = append(out, s.name)
		}
	}
	return out
}

// defaultProvider returns the provider whose receipts settle rows that
// name none (Config.DefaultProvider), outbox.NoProvider for none.
func defaultProvider(cfg Config) (string, error) {
	srcs := sources(cfg)
	switch d := cfg.DefaultProvider; {
	case d == outbox.NoProvider:
		return d, nil
	case d == "" && len(srcs) == 1:
		return srcs[0], nil
	case d == "":
		// Rows that name no provider were sent with a single provider:
		// which of these, only the deployment knows.
		return outbox.NoProvider, nil
	case slices.Contains(srcs, d):
		return d, nil
	}
	return "", fmt.Errorf("receiver: DefaultProvider %q is not a provider whose receipts this receiver verifies (%s) nor %q",
		cfg.DefaultProvider, strings.Join(srcs, ", "), outbox.NoProvider)
}

// DefaultProvider returns the provider whose receipts settle rows that
// name none, "none" for none (Config.DefaultProvider).
func (rv *Receiver) DefaultProvider() string { return rv.unnamed }

// Handler serves the receipt endpoints and, beside each, its provider's
// inbound messages (inbound.go).
func (rv *Receiver) Handler() http.Handler {
	mux := http.NewServeMux()
	if len(rv.cfg.Secrets) > 0 {
		mux.HandleFunc("/v1/receipts/generic", rv.generic)
		mux.HandleFunc("/v1/inbound/generic", rv.inboundGeneric)
	}
	if rv.cfg.TwilioToken != "" {
		mux.HandleFunc("/v1/receipts/twilio", rv.twilio)
		mux.HandleFunc("/v1/inbound/twilio", rv.inboundTwilio)
	}
	if len(rv.cfg.VonageSecret) > 0 {
		mux.HandleFunc("/v1/receipts/vonage", rv.vonage)
		mux.HandleFunc("/v1/inbound/vonage", rv.inboundVonage)
	}
	if len(rv.cfg.SinchSecret) > 0 {
		mux.HandleFunc("/v1/receipts/sinch", rv.sinch)
		mux.HandleFunc("/v1/inbound/sinch", rv.inboundSinch)
	}
	if len(rv.cfg.TelnyxPublicKey) > 0 {
		mux.HandleFunc("/v1/receipts/telnyx", rv.telnyx)
		mux.HandleFunc("/v1/inbound/telnyx", rv.inboundTelnyx)
	}
	return mux
}

// Ready reports whether receipts are being written: an error while the last
// batch failed and none committed since.
func (rv *Receiver) Ready() error {
	if p := rv.lastErr.Load(); p != nil && *p != nil {
		return fmt.Errorf("receipts are not being written: %w", *p)
	}
	return nil
}

// Run writes queued receipts until ctx is done. Stop the HTTP server first,
// so that no request waits on a writer that has stopped.
func (rv *Receiver) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range rv.cfg.Writers {
		wg.Go(func() { rv.writer(ctx) })
	}
	wg.Wait()
	return nil
}

// reply answers a receipt request with a small JSON body.
func reply(w http.ResponseWriter, code int, result string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, "{\"result\":%q}\n", result)
}

// readBody reads a receipt's body, at most MaxBody bytes; false when the
// request was answered (too large, unreadable).
func (rv *Receiver) readBody(w http.ResponseWriter, r *http.Request, count func(result string)) ([]byte, bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reply(w, http.StatusMethodNotAllowed, "method not allowed")
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			count("oversize")
			reply(w, http.StatusBadRequest, "body larger than 64 KiB")
			return nil, false
		}
		count("malformed")
		reply(w, http.StatusBadRequest, "body unreadable")
		return nil, false
	}
	return body, true
}

// generic serves POST /v1/receipts/generic:
// {"id":"msg_...","reference":"<row id>","status":"delivered"|"undelivered","code":30003,"at":"<RFC 3339>"}.
func (rv *Receiver) generic(w http.ResponseWriter, r *http.Request) {
	body, ok := rv.readBody(w, r, rv.receipts("generic"))
	if !ok {
		return
	}
	if err := VerifyGeneric(rv.cfg.Secrets, r.Header.Get(HeaderSignature), body, rv.cfg.Now(), rv.cfg.Tolerance); err != nil {
		rv.refuse(w, rv.receipts("generic"), err)
		return
	}
	var g struct {
		ID        string      `json:"id"`
		Reference string      `json:"reference"`
		Status    string      `json:"status"`
		Code      json.Number `json:"code"`
		At        string      `json:"at"`
	}
	if err := json.Unmarshal(body, &g); err != nil {
		rv.malformed(w, rv.receipts("generic"), "receipt is not the expected JSON")
		return
	}
	rc := outbox.Receipt{Source: "generic", ProviderRef: plainRef(g.ID)}
	switch g.Status {
	case "delivered":
		rc.Status = outbox.StatusDelivered
	case "undelivered":
		rc.Status = outbox.StatusUndelivered
	case "accepted", "queued", "sent":
		rc.Status = outbox.StatusSent
	default:
		rv.malformed(w, rv.receipts("generic"), "status must be delivered or undelivered")
		return
	}
	if g.Code != "" {
		n, err := g.Code.Int64()
		if err != nil || n < 0 || n >= 1<<31 {
			rv.malformed(w, rv.receipts("generic"), "code must be a non-negative integer")
			return
		}
		rc.Code = int(n)
	}
	if g.At != "" {
		at, err := time.Parse(time.RFC3339Nano, g.At)
		if err != nil {
			rv.malformed(w, rv.receipts("generic"), "at must be an RFC 3339 time")
			return
		}
		rc.At = at
	}
	rv.apply(w, r, rc, g.Reference)
}

// twilio serves POST /v1/receipts/twilio?ref=<row id>, Twilio's status
// callback: form fields MessageSid, MessageStatus, ErrorCode.
func (rv *Receiver) twilio(w http.ResponseWriter, r *http.Request) {
	body, ok := rv.readBody(w, r, rv.receipts("twilio"))
	if !ok {
		return
	}
	params, err := parseForm(body)
	if err != nil {
		rv.malformed(w, rv.receipts("twilio"), "body is not a form")
		return
	}
	full := strings.TrimRight(rv.cfg.PublicURL, "/") + r.URL.RequestURI()
	if err := VerifyTwilio(rv.cfg.TwilioToken, full, params, r.Header.Get(HeaderTwilioSignature)); err != nil {
		rv.refuse(w, rv.receipts("twilio"), err)
		return
	}
	rc := outbox.Receipt{Source: "twilio", ProviderRef: plainRef(params.Get("MessageSid"))}
	switch strings.ToLower(params.Get("MessageStatus")) {
	case "delivered", "read":
		rc.Status = outbox.StatusDelivered
	case "undelivered", "failed":
		rc.Status = outbox.StatusUndelivered
	case "queued", "sending", "sent", "accepted", "scheduled":
		// Evidence that Twilio has the message, not of its fate.
		rc.Status = outbox.StatusSent
	default:
		// canceled, receiving, received, partially_delivered or a status
		// Twilio adds later: nothing to learn; answered so that it is not
		// sent again.
		rv.metrics.count("twilio", "ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	if c := params.Get("ErrorCode"); c != "" {
		var n int
		if _, err := fmt.Sscanf(c, "%d", &n); err == nil && n > 0 && n < 1<<31 {
			rc.Code = n
		}
	}
	rv.apply(w, r, rc, r.URL.Query().Get("ref"))
}

// apply writes a verified receipt for the row named by reference and
// answers once it is committed.
func (rv *Receiver) apply(w http.ResponseWriter, r *http.Request, rc outbox.Receipt, reference string) {
	id, err := uuid.Parse(reference)
	if err != nil {
		// Not a reference of ours: nothing to change, and a non-2xx answer
		// would only have the provider send it again and again.
		rv.metrics.count(rc.Source, "unknown_reference")
		reply(w, http.StatusOK, "unknown_reference")
		return
	}
	rc.ID, rc.Unnamed = id, rv.unnamed
	ctx, cancel := context.WithTimeout(r.Context(), rv.cfg.WriteDeadline)
	defer cancel()
	res, err := rv.write(ctx, rc)
	if err != nil {
		// Not committed (or not known to be): the provider sends it again,
		// and a receipt applied twice changes nothing the second time.
		rv.metrics.count(rc.Source, "error")
		reply(w, http.StatusServiceUnavailable, "not recorded; send it again")
		return
	}
	result := classify(res)
	rv.metrics.count(rc.Source, result)
	if rv.cfg.Tracing != nil && res.Found {
		rv.traceReceipt(r, rc, result)
	}
	switch result {
	case "contradicted":
		rv.log.Warn("receipt for a message recorded dead: the provider had it, and the row now says so; a person should look at how it came to be dead",
			"outbox_id", id.String(), "receipt_status", string(rc.Status), "source", rc.Source)
	case "settled_unknown":
		rv.log.Info("receipt settled an unknown message", "outbox_id", id.String(), "status", string(rc.Status), "source", rc.Source)
	case "refused":
		rv.log.Warn("signed receipt refused: "+refusal[res.Refused]+"; answered 200, nothing changed",
			"outbox_id", id.String(), "source", rc.Source, "why", res.Refused)
	}
	reply(w, http.StatusOK, result)
}

// refusal explains each reason the database gives for refusing a receipt.
var refusal = map[string]string{
	outbox.RefusedProvider:  "the row belongs to another provider (or names none, and its receipts settle it only from RECEIPTS_DEFAULT_PROVIDER)",
	outbox.RefusedUnsent:    "no provider was asked to send the row (never claimed since it was written or replayed)",
	outbox.RefusedReference: "the receipt reports another message than the one the row's provider id names",
}

// classify names what a receipt did, for the metrics and the answer.
func classify(res outbox.ReceiptResult) string {
	switch {
	case !res.Found:
		return "unknown_reference"
	case res.Refused != "":
		return "refused"
	case res.Contradicted():
		return "contradicted"
	case res.SettledUnknown():
		return "settled_unknown"
	case res.Applied:
		return "applied"
	}
	return "unchanged"
}

func (rv *Receiver) refuse(w http.ResponseWriter, count func(result string), err error) {
	result := "forged"
	if errors.Is(err, ErrStale) {
		result = "stale"
	}
	count(result)
	reply(w, http.StatusUnauthorized, err.Error())
}

func (rv *Receiver) malformed(w http.ResponseWriter, count func(result string), why string) {
	count("malformed")
	reply(w, http.StatusBadRequest, why)
}

// receipts counts a result of a receipt from source.
func (rv *Receiver) receipts(source string) func(result string) {
	return func(result string) { rv.metrics.count(source, result) }
}

// write queues rc for the next batch and waits for its commit.
func (rv *Receiver) write(ctx context.Context, rc outbox.Receipt) (outbox.ReceiptResult, error) {
	p := &pending{r: rc, done: make(chan written, 1)}
	select {
	case rv.queue <- p:
	case <-ctx.Done():
		return outbox.ReceiptResult{}, ctx.Err()
	}
	select {
	case w := <-p.done:
		return w.res, w.err
	case <-ctx.Done():
		return outbox.ReceiptResult{}, ctx.Err()
	}
}

// writer commits batches of queued receipts until ctx is done: it takes
// the first receipt waiting, whatever else arrives within the window (up
// to MaxBatch), and writes them in one transaction, tried again on failure
// until the write deadline.
func (rv *Receiver) writer(ctx context.Context) {
	batch := make([]*pending, 0, rv.cfg.MaxBatch)
	timer := time.NewTimer(0)
	<-timer.C
	for {
		select {
		case p := <-rv.queue:
			batch = append(batch[:0], p)
		case <-ctx.Done():
			return
		}
		timer.Reset(rv.cfg.Window)
	fill:
		for len(batch) < rv.cfg.MaxBatch {
			select {
			case p := <-rv.queue:
				batch = append(batch, p)
			case <-timer.C:
				break fill
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		res, err := rv.commit(ctx, batch)
		for i, p := range batch {
			if err != nil {
				p.done <- written{err: err}
				continue
			}
			p.done <- written{res: res[i]}
		}
	}
}

// commit writes one batch, trying again on failure until the write
// deadline has passed since it began.
func (rv *Receiver) commit(ctx context.Context, batch []*pending) ([]outbox.ReceiptResult, error) {
	rs := make([]outbox.Receipt, len(batch))
	for i, p := range batch {
		rs[i] = p.r
	}
	start := time.Now()
	for failures := 0; ; failures++ {
		var res []outbox.ReceiptResult
		dbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rv.cfg.DBTimeout)
		err := pgx.BeginFunc(dbCtx, rv.cfg.Pool, func(tx pgx.Tx) error {
			var err error
			if res, err = outbox.ApplyReceipts(dbCtx, tx, rs); err != nil {
				return err
			}
			return suppressReceipted(dbCtx, tx, rs, res)
		})
		cancel()
		if err == nil {
			rv.lastErr.Store(nil)
			rv.metrics.commits.Inc()
			rv.metrics.batch.Observe(float64(len(rs)))
			rv.metrics.writeSeconds.Observe(time.Since(start).Seconds())
			return res, nil
		}
		rv.lastErr.Store(&err)
		rv.metrics.writeErrors.Inc()
		d := min(time.Second, 50*time.Millisecond<<min(failures, 5))
		if time.Since(start)+d > rv.cfg.WriteDeadline || ctx.Err() != nil {
			rv.log.Warn("receipts not written; answered 503 for the provider to send them again", "err", err, "receipts", len(rs), "failures", failures+1)
			return nil, err
		}
		time.Sleep(d)
	}
}

// suppressReceipted puts on the suppression list, in the receipts'
// transaction, the numbers of the rows whose receipts (taken, not refused)
// carry their provider's code for a recipient who opted out
// (provider.OptedOutCode: Vonage's 1240, Telnyx's 40300, 21610).
func suppressReceipted(ctx context.Context, tx pgx.Tx, rs []outbox.Receipt, res []outbox.ReceiptResult) error {
	var ids []uuid.UUID
	var provs, reasons []string
	for i, rc := range rs {
		if res[i].Found && res[i].Refused == "" && provider.OptedOutCode(rc.Source, rc.Code) {
			ids, provs, reasons = append(ids, rc.ID), append(provs, rc.Source), append(reasons, fmt.Sprintf("code %d", rc.Code))
		}
	}
	return outbox.SuppressReceipted(ctx, tx, ids, provs, reasons)
}

// plainRef returns a provider's message id fit to store, or "" when it is
// not printable ASCII of at most 200 bytes.
func plainRef(ref string) string {
	if ref == "" || len(ref) > 200 {
		return ""
	}
	for i := 0; i < len(ref); i++ {
		if ref[i] < 0x21 || ref[i] > 0x7e {
			return ""
		}
	}
	return ref
}

// Serve serves the receipt endpoints on ln and writes receipts until ctx is
// done; then it stops taking requests, lets those in flight finish (their
// receipts written) within shutdown, and stops the writers.
func (rv *Receiver) Serve(ctx context.Context, ln net.Listener, shutdown time.Duration) error {
	srv := &http.Server{
		Handler:           rv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      rv.cfg.WriteDeadline + 30*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    32 << 10,
		ErrorLog:          slog.NewLogLogger(rv.log.Handler(), slog.LevelWarn),
	}
	wctx, stopWriters := context.WithCancel(context.WithoutCancel(ctx))
	writers := make(chan error, 1)
	go func() { writers <- rv.Run(wctx) }()
	defer func() { stopWriters(); <-writers }()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("receiver: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdown)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("receiver: shutdown: %w", err)
	}
	return nil
}

// traceReceipt records the receipt's handling as a span of the request
// (the provider's trace, where it sent a traceparent) linked to the
// message's trace: a receipt comes long after the message's own spans
// ended, and a person looking at either finds the other. Only for a row
// that carries a traceparent; a failed read of it records nothing.
func (rv *Receiver) traceReceipt(r *http.Request, rc outbox.Receipt, result string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), rv.cfg.DBTimeout)
	defer cancel()
	tp, err := outbox.Traceparent(ctx, rv.cfg.Pool, rc.ID)
	if err != nil || tp == "" {
		return
	}
	msg, ok := tracing.Parse(tp)
	if !ok {
		return
	}
	parent, _ := tracing.Continue(context.Background(), r.Header.Get(tracing.Header))
	_, span := rv.cfg.Tracing.Tracer().Start(parent, "receipt "+rc.Source, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithLinks(trace.Link{SpanContext: msg}),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.HTTPRoute(r.URL.Path),
			otelattr.String("sendonce.receipt.status", string(rc.Status)), otelattr.String("sendonce.receipt.result", result),
			otelattr.String("sendonce.outbox_id", rc.ID.String())))
	span.End()
}
