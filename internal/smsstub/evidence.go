package smsstub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/receiver"
)

// Defaults of Receipts.
const (
	// DefaultReceiptDelay is how long after acceptance a message's fate is
	// known, when Receipts.Delay is zero.
	DefaultReceiptDelay = 200 * time.Millisecond
	// CodeUndelivered is the error code of an undelivered message's
	// receipt (Twilio's "unreachable destination handset").
	CodeUndelivered = 30003
	// receiptTries bounds the tries of one receipt, as a provider gives up
	// on a callback URL that keeps failing.
	receiptTries = 10
	// receiptConns is how many receipts are posted at once, and how many
	// idle keep-alive connections the receipt client keeps per callback
	// host: with Go's default of 2, every receipt beyond the second in
	// flight opened (and then closed) a connection of its own.
	receiptConns = 128
)

// Receipts configures the delivery receipts the stub sends, signed with
// Sendonce-Signature, to the callback_url each request names. A message's
// fate (delivered, or undelivered for the numbers UndeliveredSuffixes
// names) is known Delay after it is accepted: a lookup shows it from then
// on, and the receipt goes out then. The zero value sends no receipts.
type Receipts struct {
	// Secret signs receipts; empty sends none (lookups still show the
	// fate).
	Secret []byte
	// Delay and Jitter: the fate is known Delay plus U(0, Jitter) after
	// acceptance. Delay zero means DefaultReceiptDelay.
	Delay, Jitter time.Duration
	// DuplicateRate is the probability that a receipt is sent twice.
	DuplicateRate float64
	// ReorderRate is the probability that an older "accepted" receipt is
	// sent after the final one.
	ReorderRate float64
	// UndeliveredSuffixes: a message to a number ending in one of these
	// ends undelivered (code CodeUndelivered); every other is delivered.
	UndeliveredSuffixes []string
}

func (r Receipts) normalized() (Receipts, error) {
	if r.Delay == 0 {
		r.Delay = DefaultReceiptDelay
	}
	switch {
	case r.Delay < 0 || r.Jitter < 0:
		return r, fmt.Errorf("invalid Receipts.Delay %v or Jitter %v: must not be negative", r.Delay, r.Jitter)
	case !(r.DuplicateRate >= 0 && r.DuplicateRate <= 1) || !(r.ReorderRate >= 0 && r.ReorderRate <= 1):
		return r, errors.New("invalid Receipts.DuplicateRate or ReorderRate: must be within [0, 1]")
	}
	return r, nil
}

// message is one message the stub accepted, as a lookup shows it.
type message struct {
	id, reference string
	// shape is the API it came in by.
	shape shape
	// to is its number; from, service and body are kept for the Twilio
	// facade only, whose list answers them (the generic API never stores
	// a body).
	to, from, service, body string
	// created is when the stub took it; sentAt when it left the queue (at
	// Twilio: date_sent, QueueFor after created; the generic API has no
	// such step).
	created, sentAt time.Time
	// fate is delivered or undelivered, known from fateAt.
	fate   string
	fateAt time.Time
	// rec is the key's record while m is its last delivery, for the
	// receipts to mark acknowledged; nil when no receipts go out.
	rec *Delivery
}

// statusAt is the message's status as the provider reports it at now:
// queued until its fate is known, or at Twilio queued (accepted, with a
// messaging service) until sent, then sent until its fate is known.
func (m *message) statusAt(now time.Time) string {
	switch {
	case m.shape == shapeTwilio && now.Before(m.sentAt) && m.service != "":
		return "accepted"
	case m.shape == shapeTwilio && now.Before(m.sentAt):
		return "queued"
	case m.shape == shapeTwilio && now.Before(m.fateAt):
		return "sent"
	case now.Before(m.fateAt):
		return "queued"
	}
	return m.fate
}

// sendsReceipts reports whether messages taken by sh get receipts at their
// callback: generic ones when Receipts.Secret is set, Twilio's always (they
// are signed with the auth token).
func (s *Server) sendsReceipts(sh shape) bool {
	if sh == shapeTwilio {
		return true
	}
	return len(s.receipts.Secret) > 0
}

// acceptLocked records an accepted message for its reference (and, at
// Twilio, in the account's list) and returns it; s.mu is held.
func (s *Server) acceptLocked(sh shape, id string, msg messageRequest) *message {
	r := s.receipts
	fate := "delivered"
	for _, suf := range r.UndeliveredSuffixes {
		if suf != "" && strings.HasSuffix(msg.To, suf) {
			fate = "undelivered"
		}
	}
	delay := r.Delay
	if r.Jitter > 0 {
		delay += time.Duration(s.rng.Int64N(int64(r.Jitter)))
	}
	m := s.newMessage(sh, id, msg, time.Now())
	m.fate, m.fateAt = fate, m.sentAt.Add(delay)
	if sh == shapeTwilio {
		s.twilioMsgs = append(s.twilioMsgs, m)
	}
	if msg.Reference != "" {
		s.byRef[msg.Reference] = append(s.byRef[msg.Reference], m)
	}
	return m
}

// newMessage is the message msg describes, taken by sh at now, before its
// fate is drawn.
func (s *Server) newMessage(sh shape, id string, msg messageRequest, now time.Time) *message {
	m := &message{id: id, reference: msg.Reference, shape: sh, to: msg.To, created: now, sentAt: now}
	if sh == shapeTwilio {
		m.from, m.service, m.body = msg.From, msg.Service, msg.Body
		m.sentAt = now.Add(s.twilio.QueueFor)
	}
	return m
}

// sendReceipts sends m's receipt to callback once its fate is known, with
// the duplicates and reordering Receipts asks for, trying each until it is
// answered 2xx (or the stub closes, or receiptTries pass). A Twilio
// message's callback also reports it sent when it leaves the queue, and
// the older receipt a reordering sends is that one.
func (s *Server) sendReceipts(m *message, callback string, duplicate, reorder bool) {
	defer s.receiptsWG.Done()
	older := "accepted"
	if m.shape == shapeTwilio {
		older = "sent"
		if !sleepOr(time.Until(m.sentAt), s.done) {
			return
		}
		s.postReceipt(m, callback, "sent")
	}
	if !sleepOr(time.Until(m.fateAt), s.done) {
		return
	}
	acked := s.postReceipt(m, callback, m.fate)
	if duplicate {
		acked = s.postReceipt(m, callback, m.fate) || acked
	}
	if reorder {
		s.postReceipt(m, callback, older)
	}
	s.mu.Lock()
	switch {
	case acked && m.rec != nil && m.rec.ProviderID == m.id:
		m.rec.ReceiptAcked = true
	case !acked && !s.closed:
		s.stats.ReceiptsGivenUp++
	}
	s.mu.Unlock()
}

// postReceipt sends one receipt of m, with status, until it is answered 2xx
// (true) or its tries run out or the stub closes (false).
func (s *Server) postReceipt(m *message, callback, status string) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for try := range receiptTries {
		req, err := s.receiptRequest(ctx, m, callback, status)
		if err != nil {
			return false
		}
		resp, err := s.postOne(req)
		if err == nil {
			if resp.StatusCode >= 200 && resp.StatusCode < 300 {
				s.count(func(st *Stats) { st.ReceiptsSent++ })
				return true
			}
		}
		s.count(func(st *Stats) { st.ReceiptFailures++ })
		if !sleepOr(min(5*time.Second, s.receiptBackoff<<try), s.done) {
			return false
		}
	}
	s.log.Warn("receipt given up after its tries", "provider_id", m.id)
	return false
}

// receiptRequest is m's receipt of status for callback: the generic JSON
// signed with Sendonce-Signature, or Twilio's form signed with
// X-Twilio-Signature.
func (s *Server) receiptRequest(ctx context.Context, m *message, callback, status string) (*http.Request, error) {
	if m.shape == shapeTwilio {
		return s.twilioCallback(ctx, m, callback, status)
	}
	body := map[string]any{"id": m.id, "reference": m.reference, "status": status, "at": m.fateAt.UTC().Format(time.RFC3339Nano)}
	if status == "undelivered" {
		body["code"] = CodeUndelivered
	}
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, callback, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	// Signed at each try: a receipt retried later is not stale.
	req.Header.Set(receiver.HeaderSignature, receiver.SignGeneric(s.receipts.Secret, raw, time.Now()))
	return req, nil
}

// postOne posts one receipt when one of the receiptConns slots is free
// (or fails once the stub closes), and reads the answer to its end so that
// the connection goes back to the idle pool.
func (s *Server) postOne(req *http.Request) (*http.Response, error) {
	select {
	case s.receiptSlots <- struct{}{}:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	defer func() { <-s.receiptSlots }()
	resp, err := s.receiptClient.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp, nil
}

// newReceiptClient returns the client receipts are posted with: redirects
// are not followed, and up to receiptConns connections per callback host
// are kept alive between receipts.
func newReceiptClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = receiptConns
	t.MaxIdleConnsPerHost = receiptConns
	return &http.Client{Timeout: 5 * time.Second, Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (s *Server) count(fn func(*Stats)) {
	s.mu.Lock()
	fn(&s.stats)
	s.mu.Unlock()
}

// sleepOr waits d, or until done is closed (false).
func sleepOr(d time.Duration, done <-chan struct{}) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// validCallback reports whether a request's callback_url is one the stub
// will post receipts to: an absolute http(s) URL.
func validCallback(u string) bool {
	p, err := url.Parse(u)
	return err == nil && (p.Scheme == "http" || p.Scheme == "https") && p.Host != ""
}

// lookupResponse is GET /v1/messages?reference=...'s body.
type lookupResponse struct {
	Messages []lookupMessage `json:"messages"`
}

type lookupMessage struct {
	ID        string `json:"id"`
	Reference string `json:"reference"`
	Status    string `json:"status"`
}

// handleLookup serves GET /v1/messages?reference=<ref>: every message the
// stub accepted with that reference, an empty list when none.
func (s *Server) handleLookup(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="smsstub"`)
		writeError(w, http.StatusUnauthorized, CodeAuthFailed, "authentication failed")
		return
	}
	ref := r.URL.Query().Get("reference")
	if ref == "" {
		writeError(w, http.StatusBadRequest, http.StatusBadRequest, "reference is required")
		return
	}
	now := time.Now()
	s.mu.Lock()
	s.stats.Lookups++
	if f := s.faults; f.LookupFailRate > 0 && s.rng.Float64() < f.LookupFailRate {
		s.stats.LookupFailures++
		s.mu.Unlock()
		writeError(w, http.StatusInternalServerError, http.StatusInternalServerError, "injected lookup failure")
		return
	}
	out := lookupResponse{Messages: []lookupMessage{}}
	for _, m := range s.byRef[ref] {
		out.Messages = append(out.Messages, lookupMessage{ID: m.id, Reference: m.reference, Status: m.statusAt(now)})
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, mustJSON(out))
}

// Messages returns the messages accepted for reference, as a lookup shows
// them now.
func (s *Server) Messages(reference string) []string {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, m := range s.byRef[reference] {
		out = append(out, m.statusAt(now))
	}
	return out
}
