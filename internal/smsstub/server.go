package smsstub

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sendonce/sendonce/internal/safetext"
)

// Limits of the messages API.
const (
	// MaxRequestBytes is the largest /v1/messages request body read; larger
	// bodies get 413.
	MaxRequestBytes = 64 << 10
	// MaxBodyChars is the longest message text accepted, in Unicode code
	// points; longer texts get 400 code CodeBodyTooLong.
	MaxBodyChars = 1600
	// MaxKeyLen is the longest Idempotency-Key accepted, in bytes; it bounds
	// the memory a misbehaving client can make the stub hold per key.
	MaxKeyLen = 255
)

// Provider error codes in the JSON bodies of error responses. They follow
// Twilio's numbering, which is what the contract was modelled on. Errors
// that have no provider-specific code (missing key, bad JSON, 409, 422, …)
// use the HTTP status as their code.
const (
	// CodeAuthFailed accompanies 401: missing or wrong API key.
	CodeAuthFailed = 20003
	// CodeRateLimited accompanies an injected 429.
	CodeRateLimited = 20429
	// CodeInvalidTo accompanies 400 when "to" is not an E.164 number.
	CodeInvalidTo = 21211
	// CodeBodyRequired accompanies 400 when "body" is empty.
	CodeBodyRequired = 21602
	// CodeBodyTooLong accompanies 400 when "body" exceeds MaxBodyChars.
	CodeBodyTooLong = 21617
	// CodeExpired accompanies 400 when a message's "expires_at" had
	// passed when its request arrived: nothing is delivered. It is
	// Twilio's code for a message whose validity period ran out before
	// Twilio sent it ("Validity Period Expired").
	CodeExpired = 30036
	// CodeOptedOut accompanies 400 when the recipient opted out (OptOut,
	// or a STOP sent through SendInbound to the Twilio facade): Twilio's
	// 21610, "Attempt to send to unsubscribed recipient". Nothing is
	// delivered.
	CodeOptedOut = 21610
)

// Delivery is what the stub knows about one idempotency key. It never
// includes the message text.
type Delivery struct {
	// To is the recipient of the last delivery made for the key, empty if
	// none was made yet.
	To string `json:"to"`
	// Deliveries counts the messages actually sent for the key: 1 when
	// idempotency works, more when the key was resent after its retention
	// expired or the stub ignores keys.
	Deliveries int `json:"deliveries"`
	// Requests counts every authenticated /v1/messages request that carried
	// the key, whatever its outcome, so tests can see retries reach the stub.
	Requests int `json:"requests"`
	// ProviderID is the id minted for the last delivery, empty if none.
	ProviderID string `json:"provider_id"`
	// ExpiresAt is the expiry the last delivery's request carried
	// (expires_at), zero (and absent from JSON) when it carried none.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// ValidityPeriod is the ValidityPeriod, in seconds, that the last
	// delivery's request to the Twilio facade carried; 0 (and absent from
	// JSON) when it carried none.
	ValidityPeriod int `json:"validity_period,omitempty"`
	// Fate is the last delivery's fate, delivered or undelivered, when the
	// stub sends receipts for it (Receipts.Secret and a callback_url);
	// empty otherwise.
	Fate string `json:"fate,omitempty"`
	// ReceiptAcked is set once a receipt of the last delivery's fate was
	// answered 2xx: the receiver has made it durable.
	ReceiptAcked bool `json:"receipt_acked,omitempty"`
}

// Stats are the stub's counters since it started or was last reset.
type Stats struct {
	// Requests counts every POST /v1/messages (and to the Twilio facade),
	// including rejected ones.
	Requests int64 `json:"requests"`
	// Deliveries counts messages sent (successes, including withheld ones).
	Deliveries int64 `json:"deliveries"`
	// Replays counts stored responses replayed for a seen key.
	Replays int64 `json:"replays"`
	// Conflicts counts 409s for a key whose first request was in flight.
	Conflicts int64 `json:"conflicts"`
	// Mismatches counts 422s for a key reused with a different body.
	Mismatches int64 `json:"mismatches"`
	// Failures counts injected failures (Faults.FailRate).
	Failures int64 `json:"failures"`
	// RateLimited counts injected 429s (Faults.RateLimitRate).
	RateLimited int64 `json:"rate_limited"`
	// OverLimit counts 429s for requests above Faults.RateLimit.
	OverLimit int64 `json:"over_limit"`
	// Withheld counts deliveries whose response was withheld.
	Withheld int64 `json:"withheld"`
	// Expired counts requests refused because their expires_at had passed
	// when they arrived (400 code CodeExpired).
	Expired int64 `json:"expired"`
	// OptedOut counts requests refused because their recipient opted out
	// (400 code CodeOptedOut).
	OptedOut int64 `json:"opted_out"`
	// Keys is the number of distinct idempotency keys seen.
	Keys int64 `json:"keys"`
	// Dropped counts requests lost before they were taken (DropRate).
	Dropped int64 `json:"dropped"`
	// Lookups and LookupFailures count GET /v1/messages (and the Twilio
	// facade's lists) and their injected failures.
	Lookups        int64 `json:"lookups"`
	LookupFailures int64 `json:"lookup_failures"`
	// ReceiptsSent counts receipts answered 2xx; ReceiptFailures the tries
	// that were not.
	ReceiptsSent    int64 `json:"receipts_sent"`
	ReceiptFailures int64 `json:"receipt_failures"`
	// ReceiptsLost counts messages whose receipts were never sent
	// (Faults.ReceiptLossRate).
	ReceiptsLost int64 `json:"receipts_lost"`
	// ReceiptsGivenUp counts messages whose fate no receipt got answered
	// 2xx for, after every try.
	ReceiptsGivenUp int64 `json:"receipts_given_up"`
}

// Server is the stub. Its methods are safe for concurrent use.
type Server struct {
	apiKey     []byte
	retention  time.Duration
	ignoreKeys bool
	log        *slog.Logger
	now        func() time.Time
	handler    http.Handler

	// done is closed by Close to release withheld and delayed requests, so
	// that http.Server.Shutdown is not held up by them.
	done      chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex
	faults Faults
	rng    *mrand.Rand
	// gen is bumped by Reset so that requests in flight across a reset do
	// not write into the fresh state.
	gen     uint64
	entries map[string]*entry
	// expiry lists stored entries in the order they were stored; as the
	// retention is fixed, that is also the order they expire in, so pruning
	// only ever looks at the head and costs O(1) amortised per request.
	expiry     []expiryItem
	expiryHead int
	records    map[string]*Delivery
	// takenAt is when the request that made each key's last delivery
	// arrived (Taken); apart from records, whose JSON and values are
	// compared whole by their users.
	takenAt map[string]time.Time
	stats   Stats
	// optedOut are the numbers whose messages are refused (OptOut).
	optedOut map[string]bool
	// receipts is the receipts configuration; byRef the messages accepted
	// per reference, for lookups.
	receipts Receipts
	byRef    map[string][]*message
	// twilio configures the Twilio facade; twilioMsgs are the messages it
	// took, in the order it took them (its list sorts them).
	twilio        Twilio
	twilioMsgs    []*message
	receiptsWG    sync.WaitGroup
	closed        bool
	receiptClient *http.Client
	// receiptSlots bounds the receipts being posted at once to
	// receiptConns, as many as receiptClient keeps idle connections for.
	receiptSlots chan struct{}
	// receiptBackoff is the pause after a receipt's first failed try,
	// doubled after each further one (up to 5 s).
	receiptBackoff time.Duration
	// tokens and tokensAt are the RateLimit token bucket (wall clock, not
	// the retention clock: rates are real time).
	tokens   float64
	tokensAt time.Time
}

// takeTokenLocked takes a token of the RateLimit bucket; s.mu is held.
func (s *Server) takeTokenLocked(f Faults) bool {
	now := time.Now()
	if s.tokensAt.IsZero() {
		s.tokens, s.tokensAt = f.RateBurst, now
	}
	s.tokens = min(f.RateBurst, s.tokens+now.Sub(s.tokensAt).Seconds()*f.RateLimit)
	s.tokensAt = now
	if s.tokens < 1 {
		return false
	}
	s.tokens--
	return true
}

// entry is the idempotency cache's state for one key.
type entry struct {
	hash [sha256.Size]byte
	// stored is false while the first request is in flight.
	stored  bool
	status  int
	body    []byte
	expires time.Time
}

type expiryItem struct {
	key string
	e   *entry
}

// New returns a Server configured by cfg, or an error naming the first
// invalid field.
func New(cfg Config) (*Server, error) {
	if cfg.Retention < 0 {
		return nil, fmt.Errorf("smsstub: invalid Retention %v: must not be negative", cfg.Retention)
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	faults, err := cfg.Faults.normalized()
	if err != nil {
		return nil, fmt.Errorf("smsstub: %w", err)
	}
	receipts, err := cfg.Receipts.normalized()
	if err != nil {
		return nil, fmt.Errorf("smsstub: %w", err)
	}
	tw, err := cfg.Twilio.normalized()
	if err != nil {
		return nil, fmt.Errorf("smsstub: %w", err)
	}
	src := cfg.Rand
	if src == nil {
		if cfg.Seed != 0 {
			src = mrand.NewPCG(uint64(cfg.Seed), uint64(cfg.Seed))
		} else {
			src = mrand.NewPCG(mrand.Uint64(), mrand.Uint64())
		}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	s := &Server{
		retention:      cfg.Retention,
		ignoreKeys:     cfg.IgnoreKeys,
		log:            logger,
		now:            now,
		done:           make(chan struct{}),
		faults:         faults,
		rng:            mrand.New(src),
		entries:        make(map[string]*entry),
		records:        make(map[string]*Delivery),
		takenAt:        make(map[string]time.Time),
		optedOut:       make(map[string]bool),
		receipts:       receipts,
		byRef:          make(map[string][]*message),
		twilio:         tw,
		receiptBackoff: 100 * time.Millisecond,
		receiptClient:  newReceiptClient(),
		receiptSlots:   make(chan struct{}, receiptConns),
	}
	if cfg.APIKey != "" {
		s.apiKey = []byte(cfg.APIKey)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", s.handleMessage)
	mux.HandleFunc("GET /v1/messages", s.handleLookup)
	if tw.AccountSID != "" {
		mux.HandleFunc("POST "+twilioPath, s.handleTwilioCreate)
		mux.HandleFunc("GET "+twilioPath, s.handleTwilioList)
	}
	mux.HandleFunc("GET /admin/deliveries", s.handleDeliveries)
	mux.HandleFunc("GET /admin/taken", s.handleTaken)
	mux.HandleFunc("GET /admin/stats", s.handleStats)
	mux.HandleFunc("POST /admin/reset", s.handleReset)
	mux.HandleFunc("GET /admin/faults", s.handleGetFaults)
	mux.HandleFunc("POST /admin/faults", s.handleSetFaults)
	mux.HandleFunc("POST /admin/inbound", s.handleInbound)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	s.handler = mux
	return s, nil
}

// Handler returns the HTTP handler serving the messages and admin APIs.
func (s *Server) Handler() http.Handler { return s.handler }

// Close releases every request that is withheld in WithholdHang mode or
// waiting out its latency, and makes later ones return at once, so that an
// http.Server's Shutdown can complete. Withheld requests are released by
// dropping their connection, never by answering them. The Server keeps
// serving otherwise, but sends no more receipts: Close waits for those in
// flight to give up. Close always returns nil.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.done) })
	// No receipt starts once closed is set (under mu, as they start).
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.receiptsWG.Wait()
	s.receiptClient.CloseIdleConnections()
	return nil
}

// SetFaults replaces the faults in force, applying the same defaults and
// validation as New. Requests already past their fault decisions are not
// affected.
func (s *Server) SetFaults(f Faults) error {
	f, err := f.normalized()
	if err != nil {
		return fmt.Errorf("smsstub: set faults: %w", err)
	}
	s.mu.Lock()
	s.faults = f
	s.mu.Unlock()
	s.log.Info("faults changed",
		"fail_rate", f.FailRate, "fail_status", f.FailStatus, "fail_code", f.FailCode,
		"rate_limit_rate", f.RateLimitRate, "retry_after", f.RetryAfter.String(),
		"latency", f.Latency.String(), "latency_jitter", f.LatencyJitter.String(),
		"withhold_rate", f.WithholdRate, "withhold_mode", f.WithholdMode)
	return nil
}

// Faults returns the faults in force, with defaults applied.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// Deliveries returns a copy of the per-key records, keyed by idempotency key.
func (s *Server) Deliveries() map[string]Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Delivery, len(s.records))
	for k, d := range s.records {
		out[k] = *d
	}
	return out
}

// Taken returns, by idempotency key, when the request that made the key's
// last delivery arrived, by the stub's clock (Config.Now) and before any
// Latency: the time of the provider call, which a test of send times
// compares with each message's send time. Keys without a delivery are
// absent.
func (s *Server) Taken() map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.takenAt)
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Keys = int64(len(s.records))
	return st
}

// Reset forgets every delivery record, stored response and counter. Faults
// are configuration and are kept. Requests in flight during the reset are
// answered but leave no trace in the fresh state.
func (s *Server) Reset() {
	s.mu.Lock()
	s.gen++
	s.entries = make(map[string]*entry)
	s.expiry = nil
	s.expiryHead = 0
	s.records = make(map[string]*Delivery)
	s.takenAt = make(map[string]time.Time)
	s.byRef = make(map[string][]*message)
	s.twilioMsgs = nil
	s.optedOut = make(map[string]bool)
	s.stats = Stats{}
	s.mu.Unlock()
	s.log.Info("state reset")
}

// messageRequest is the /v1/messages request body.
type messageRequest struct {
	To   string `json:"to"`
	Body string `json:"body"`
	// Reference is the sender's own id for the message (a lookup finds the
	// message by it); CallbackURL is where its receipts go.
	Reference   string `json:"reference,omitempty"`
	CallbackURL string `json:"callback_url,omitempty"`
	// ExpiresAt is the message's expiry as sent (RFC 3339), "" for none;
	// expires is it parsed.
	ExpiresAt string `json:"expires_at,omitempty"`
	expires   time.Time
	// From, Service and ValidityPeriod are a Twilio request's From,
	// MessagingServiceSid and ValidityPeriod (seconds, 0 for none); the
	// generic API has none of them.
	From           string `json:"-"`
	Service        string `json:"-"`
	ValidityPeriod int    `json:"-"`
}

// messageResponse is the /v1/messages success body.
type messageResponse struct {
	ID     string `json:"id"`
	To     string `json:"to"`
	Status string `json:"status"`
}

// errorResponse is the body of every error the stub answers.
type errorResponse struct {
	Code    int    `json:"code,omitempty"`
	Message string `json:"message"`
}

// Messages of the idempotency errors, part of the contract.
const (
	msgKeyRequired = "Idempotency-Key required"
	msgInProgress  = "a request with this Idempotency-Key is in progress"
	msgMismatch    = "Idempotency-Key reused with a different request body"
	msgExpired     = "message expired before it was taken: expires_at had passed when the request arrived"
	msgOptedOut    = "Attempt to send to unsubscribed recipient"
)

func (s *Server) handleMessage(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="smsstub"`)
		// Unauthenticated requests are not attributed to their key: they
		// must not be able to create state.
		s.reject(r.Context(), w, shapeGeneric, "", false, http.StatusUnauthorized, CodeAuthFailed, "authentication failed")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	perKey := key != "" || s.ignoreKeys
	switch {
	case key == "" && !s.ignoreKeys:
		s.reject(r.Context(), w, shapeGeneric, key, false, http.StatusBadRequest, http.StatusBadRequest, msgKeyRequired)
		return
	case len(key) > MaxKeyLen:
		s.reject(r.Context(), w, shapeGeneric, key, false, http.StatusBadRequest, http.StatusBadRequest,
			"Idempotency-Key longer than "+strconv.Itoa(MaxKeyLen)+" bytes")
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		s.reject(r.Context(), w, shapeGeneric, key, perKey, http.StatusUnsupportedMediaType, http.StatusUnsupportedMediaType,
			"Content-Type must be application/json")
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			s.reject(r.Context(), w, shapeGeneric, key, perKey, http.StatusRequestEntityTooLarge, http.StatusRequestEntityTooLarge,
				"request body larger than "+strconv.Itoa(MaxRequestBytes)+" bytes")
			return
		}
		// The client went away mid-body; nobody will read the answer.
		s.reject(r.Context(), w, shapeGeneric, key, perKey, http.StatusBadRequest, http.StatusBadRequest, "could not read request body")
		return
	}
	msg, code, problem := parseMessage(raw)
	if problem != "" {
		s.reject(r.Context(), w, shapeGeneric, key, perKey, http.StatusBadRequest, code, problem)
		return
	}
	s.process(w, r, shapeGeneric, key, raw, msg)
}

// authorized reports whether r carries the configured API key.
func (s *Server) authorized(r *http.Request) bool {
	if s.apiKey == nil {
		return true
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	// Constant time so the stub does not teach bad habits to whoever copies it.
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), s.apiKey) == 1
}

// parseMessage decodes and validates a request body. On failure it returns
// the provider code and message of the 400 to answer.
func parseMessage(raw []byte) (messageRequest, int, string) {
	var m messageRequest
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&m); err != nil {
		return m, http.StatusBadRequest, "invalid JSON body"
	}
	// A second value after the object means the client sent something other
	// than the one object the contract allows.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return m, http.StatusBadRequest, "invalid JSON body: trailing data after the object"
	}
	switch n := utf8.RuneCountInString(m.Body); {
	case !validE164(m.To):
		return m, CodeInvalidTo, "invalid To number"
	case n == 0:
		return m, CodeBodyRequired, "message body is required"
	case n > MaxBodyChars:
		return m, CodeBodyTooLong, "message body exceeds the " + strconv.Itoa(MaxBodyChars) + " character limit"
	}
	if m.ExpiresAt != "" {
		t, err := time.Parse(time.RFC3339Nano, m.ExpiresAt)
		if err != nil {
			return m, http.StatusBadRequest, "invalid expires_at: not an RFC 3339 date-time"
		}
		m.expires = t
	}
	return m, 0, ""
}

// validE164 reports whether to matches ^\+[1-9][0-9]{1,14}$, without the
// cost of a regexp on the hot path.
func validE164(to string) bool {
	if len(to) < 3 || len(to) > 16 || to[0] != '+' || to[1] < '1' || to[1] > '9' {
		return false
	}
	for i := 2; i < len(to); i++ {
		if to[i] < '0' || to[i] > '9' {
			return false
		}
	}
	return true
}

// process runs a well-formed request through the idempotency cache (of
// the generic API only: Twilio has none) and the faults, and answers it in
// the shape it came in.
func (s *Server) process(w http.ResponseWriter, r *http.Request, sh shape, key string, raw []byte, msg messageRequest) {
	ctx := r.Context()
	hash := sha256.Sum256(raw)

	s.mu.Lock()
	s.stats.Requests++
	s.recordLocked(key).Requests++
	now := s.now()
	var e *entry
	cached := sh == shapeGeneric && !s.ignoreKeys
	if cached {
		s.pruneLocked(now)
		if old, ok := s.entries[key]; ok {
			switch {
			case old.stored && !now.Before(old.expires):
				// Expired but not yet pruned (the clock went backwards, or
				// it is not at the head of the queue): treat as unseen.
				delete(s.entries, key)
			case old.hash != hash:
				s.stats.Mismatches++
				s.mu.Unlock()
				s.logOutcome(ctx, "mismatch", http.StatusUnprocessableEntity, "")
				writeError(w, http.StatusUnprocessableEntity, http.StatusUnprocessableEntity, msgMismatch)
				return
			case !old.stored:
				s.stats.Conflicts++
				s.mu.Unlock()
				s.logOutcome(ctx, "conflict", http.StatusConflict, "")
				writeError(w, http.StatusConflict, http.StatusConflict, msgInProgress)
				return
			default:
				s.stats.Replays++
				status, body := old.status, old.body
				s.mu.Unlock()
				s.logOutcome(ctx, "replay", status, "")
				w.Header().Set("Idempotent-Replayed", "true")
				writeJSON(w, status, body)
				return
			}
		}
	}
	// A message whose expiry had passed when it arrived is not taken, as
	// a provider that drops expired messages would not. After the cache:
	// a retry of a message taken in time gets its replay, not a refusal
	// that would say nothing was sent.
	if !msg.expires.IsZero() && !now.Before(msg.expires) {
		s.stats.Expired++
		s.mu.Unlock()
		s.logOutcome(ctx, "expired", http.StatusBadRequest, "")
		sh.writeError(w, http.StatusBadRequest, CodeExpired, msgExpired)
		return
	}
	// A recipient who opted out gets nothing, as at a provider that
	// blocks opted-out numbers; likewise after the cache.
	if s.optedOut[msg.To] {
		s.stats.OptedOut++
		s.mu.Unlock()
		s.logOutcome(ctx, "opted_out", http.StatusBadRequest, "")
		sh.writeError(w, http.StatusBadRequest, CodeOptedOut, msgOptedOut)
		return
	}
	if cached {
		e = &entry{hash: hash}
		s.entries[key] = e
	}
	// Snapshot the faults and draw every decision now, under the lock the
	// random source needs anyway; a later SetFaults does not affect this
	// request.
	f := s.faults
	if f.GenericOnly && sh != shapeGeneric {
		f = Faults{}
	}
	gen := s.gen
	delay := f.Latency
	if f.LatencyJitter > 0 {
		delay += time.Duration(s.rng.Int64N(int64(f.LatencyJitter)))
	}
	overLimit := f.RateLimit > 0 && !s.takeTokenLocked(f)
	limited := !overLimit && f.RateLimitRate > 0 && s.rng.Float64() < f.RateLimitRate
	failed := !overLimit && !limited && f.FailRate > 0 && s.rng.Float64() < f.FailRate
	dropped := !overLimit && !limited && !failed && f.DropRate > 0 && s.rng.Float64() < f.DropRate
	withhold := !limited && !failed && !dropped && f.WithholdRate > 0 && s.rng.Float64() < f.WithholdRate
	duplicate := s.receipts.DuplicateRate > 0 && s.rng.Float64() < s.receipts.DuplicateRate
	reorder := s.receipts.ReorderRate > 0 && s.rng.Float64() < s.receipts.ReorderRate
	receiptLost := f.ReceiptLossRate > 0 && s.rng.Float64() < f.ReceiptLossRate
	s.mu.Unlock()

	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			// The client gave up before the provider got round to the
			// message, so it was never sent: forget the key.
			t.Stop()
			s.settle(key, e, gen, nil)
			s.logOutcome(ctx, "abandoned", 0, "")
			return
		case <-s.done:
			t.Stop()
			s.settle(key, e, gen, nil)
			s.logOutcome(ctx, "shutting_down", http.StatusServiceUnavailable, "")
			sh.writeError(w, http.StatusServiceUnavailable, http.StatusServiceUnavailable, "server shutting down")
			return
		}
	}

	switch {
	case overLimit:
		s.settle(key, e, gen, func(st *Stats) { st.OverLimit++ })
		s.logOutcome(ctx, "over_limit", http.StatusTooManyRequests, "")
		sh.writeError(w, http.StatusTooManyRequests, CodeRateLimited, "too many requests")
		return
	case limited:
		s.settle(key, e, gen, func(st *Stats) { st.RateLimited++ })
		s.logOutcome(ctx, "rate_limited", http.StatusTooManyRequests, "")
		w.Header().Set("Retry-After", retryAfterSeconds(f.RetryAfter))
		sh.writeError(w, http.StatusTooManyRequests, CodeRateLimited, "too many requests")
		return
	case failed:
		s.settle(key, e, gen, func(st *Stats) { st.Failures++ })
		s.logOutcome(ctx, "failed", f.FailStatus, "")
		sh.writeError(w, f.FailStatus, f.FailCode, "injected failure")
		return
	case dropped:
		// Lost on the way in: nothing taken, no answer.
		s.settle(key, e, gen, func(st *Stats) { st.Dropped++ })
		s.logOutcome(ctx, "dropped", 0, "")
		s.withhold(w, r, WithholdClose)
		return
	}

	id := sh.newID()
	var body []byte
	s.mu.Lock()
	if gen == s.gen {
		rec := s.recordLocked(key)
		rec.Deliveries++
		rec.To = msg.To
		rec.ProviderID = id
		rec.ExpiresAt = msg.expires
		s.takenAt[key] = now
		rec.ValidityPeriod = msg.ValidityPeriod
		s.stats.Deliveries++
		if withhold {
			s.stats.Withheld++
		}
		m := s.acceptLocked(sh, id, msg)
		body = s.created(sh, m)
		rec.Fate, rec.ReceiptAcked = "", false
		if s.sendsReceipts(sh) && validCallback(msg.CallbackURL) && !s.closed {
			m.rec, rec.Fate = rec, m.fate
			if receiptLost {
				s.stats.ReceiptsLost++
			} else {
				s.receiptsWG.Add(1)
				go s.sendReceipts(m, msg.CallbackURL, duplicate, reorder)
			}
		}
		if e != nil && s.entries[key] == e {
			e.stored = true
			e.status = http.StatusCreated
			e.body = body
			e.expires = s.now().Add(s.retention)
			s.expiry = append(s.expiry, expiryItem{key: key, e: e})
		}
	} else {
		// Answered as if taken, though a Reset forgot it meanwhile.
		body = s.created(sh, s.newMessage(sh, id, msg, time.Now()))
	}
	s.mu.Unlock()

	if withhold {
		s.logTaken(ctx, "withheld_"+f.WithholdMode, id, msg.To)
		s.withhold(w, r, f.WithholdMode)
		return
	}
	s.logTaken(ctx, "delivered", id, msg.To)
	writeJSON(w, http.StatusCreated, body)
}

// settle ends a request that was not delivered: its in-flight entry is
// removed so that a retry is processed afresh, and count, if non-nil,
// updates the counters. Both are skipped if a Reset intervened.
func (s *Server) settle(key string, e *entry, gen uint64, count func(*Stats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen {
		return
	}
	if e != nil && s.entries[key] == e {
		delete(s.entries, key)
	}
	if count != nil {
		count(&s.stats)
	}
}

// withhold never answers the request: it drops the connection at once
// (WithholdClose) or once the client or the Server gives up (WithholdHang).
func (s *Server) withhold(w http.ResponseWriter, r *http.Request, mode string) {
	if mode == WithholdClose {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
			return
		}
		// Hijacking is impossible (HTTP/2); aborting the handler is the
		// closest equivalent: net/http resets the stream or connection.
		panic(http.ErrAbortHandler)
	}
	select {
	case <-r.Context().Done():
	case <-s.done:
	}
	// Returning normally would make net/http send an empty 200; aborting
	// drops the connection without a response, which is the point.
	panic(http.ErrAbortHandler)
}

// reject answers a request that failed a check before reaching the
// idempotency cache, counting it (and, if perKey, attributing it to key).
func (s *Server) reject(ctx context.Context, w http.ResponseWriter, sh shape, key string, perKey bool, status, code int, message string) {
	s.mu.Lock()
	s.stats.Requests++
	if perKey {
		s.recordLocked(key).Requests++
	}
	s.mu.Unlock()
	s.logOutcome(ctx, "rejected", status, "")
	sh.writeError(w, status, code, message)
}

// recordLocked returns key's record, creating it if needed. s.mu must be
// held.
func (s *Server) recordLocked(key string) *Delivery {
	rec, ok := s.records[key]
	if !ok {
		rec = &Delivery{}
		s.records[key] = rec
	}
	return rec
}

// pruneLocked drops stored entries that expired by now from the head of
// the expiry queue. s.mu must be held.
func (s *Server) pruneLocked(now time.Time) {
	for s.expiryHead < len(s.expiry) {
		it := s.expiry[s.expiryHead]
		if now.Before(it.e.expires) {
			break
		}
		// The key may have been stored again since; only drop this entry.
		if s.entries[it.key] == it.e {
			delete(s.entries, it.key)
		}
		s.expiry[s.expiryHead] = expiryItem{}
		s.expiryHead++
	}
	// Compact once the consumed prefix dominates, so the slice does not
	// grow without bound under steady traffic.
	if s.expiryHead > 1024 && s.expiryHead*2 > len(s.expiry) {
		n := copy(s.expiry, s.expiry[s.expiryHead:])
		clear(s.expiry[n:])
		s.expiry = s.expiry[:n]
		s.expiryHead = 0
	}
}

// logOutcome logs one request's outcome at debug level. It deliberately
// takes no key, number or body.
func (s *Server) logOutcome(ctx context.Context, outcome string, status int, providerID string) {
	if !s.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := []slog.Attr{slog.String("outcome", outcome), slog.Int("status", status)}
	if providerID != "" {
		attrs = append(attrs, slog.String("provider_id", providerID))
	}
	s.log.LogAttrs(ctx, slog.LevelDebug, "message request", attrs...)
}

// logTaken says, at info, that the stub took a message: the id the stub
// gave it (which relay trace shows as the row's provider id), the number
// masked, and whether the answer went back; a person following one message
// sees it arrive. The key stays out of the log, as every credential-like
// header does.
func (s *Server) logTaken(ctx context.Context, outcome, providerID, to string) {
	if !s.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "message taken", slog.String("outcome", outcome),
		slog.String("provider_id", providerID), slog.String("to", safetext.MaskPhone(to)))
}

// retryAfterSeconds formats d as Retry-After delta-seconds, rounded up and
// at least 1 so that clients never retry immediately.
func retryAfterSeconds(d time.Duration) string {
	secs := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(secs, 1), 10)
}

// shape is the API a send request came in by: it decides the form of the
// answers and of the ids, and whether the idempotency cache applies.
type shape int

const (
	// shapeGeneric is the generic API (POST /v1/messages).
	shapeGeneric shape = iota
	// shapeTwilio is the Twilio facade (twilio.go): never idempotent.
	shapeTwilio
)

// newID mints a message id: "msg_" and 24 random hex digits, or at Twilio
// "SM" and 32.
func (sh shape) newID() string {
	if sh == shapeTwilio {
		return "SM" + randomHex(16)
	}
	return "msg_" + randomHex(12)
}

// writeError answers an error in the shape's form. A zero code is omitted
// by the generic API; Twilio always sends one of its own (20000 and the
// status, for a zero code or one that is an HTTP status).
func (sh shape) writeError(w http.ResponseWriter, status, code int, message string) {
	if sh == shapeTwilio {
		writeTwilioError(w, status, code, message)
		return
	}
	writeError(w, status, code, message)
}

// created is the 201 body for the accepted message m.
func (s *Server) created(sh shape, m *message) []byte {
	if sh == shapeTwilio {
		return mustJSON(s.twilioResource(m, m.created))
	}
	return mustJSON(messageResponse{ID: m.id, To: m.to, Status: "queued"})
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms.
	return hex.EncodeToString(b)
}

// mustJSON marshals v, a type that cannot fail to marshal, and appends a
// newline for the benefit of curl users.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("smsstub: marshal %T: %v", v, err))
	}
	return append(b, '\n')
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, status, code int, message string) {
	writeJSON(w, status, mustJSON(errorResponse{Code: code, Message: message}))
}
