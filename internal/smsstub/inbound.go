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

// Inbound is a message a recipient sends to a number of the provider's
// (a reply such as STOP), which the stub forwards to the receiver as its
// API forwards inbound messages (SendInbound).
type Inbound struct {
	// URL is where it is posted: the receiver's /v1/inbound/generic or
	// /v1/inbound/twilio, as the receiver's public URL names it (a Twilio
	// signature covers the URL).
	URL string `json:"url"`
	// Shape is "generic" (the JSON {"id","from","to","text"}, signed with
	// Receipts.Secret as receipts are) or "twilio" (Twilio's
	// incoming-message form, signed with Twilio.AuthToken).
	Shape string `json:"shape"`
	// From is the recipient's number, To the provider's number it replied
	// to, Text what it wrote.
	From string `json:"from"`
	To   string `json:"to"`
	Text string `json:"text"`
}

// SendInbound posts in to in.URL, signed, and returns the status the
// receiver answered. An opt-out keyword sent in the Twilio shape also
// opts the number out at the Twilio facade and the generic API (OptOut),
// and an opt-in lifts it (OptIn), as Twilio's own keyword handling blocks
// a number that replied STOP.
func (s *Server) SendInbound(ctx context.Context, in Inbound) (int, error) {
	req, err := s.inboundRequest(ctx, in)
	if err != nil {
		return 0, err
	}
	res, err := s.receiptClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("smsstub: post an inbound message: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	if in.Shape == "twilio" {
		if _, lift, ok := receiver.Keyword(in.Text); ok {
			if lift {
				s.OptIn(in.From)
			} else {
				s.OptOut(in.From)
			}
		}
	}
	return res.StatusCode, nil
}

func (s *Server) inboundRequest(ctx context.Context, in Inbound) (*http.Request, error) {
	u, err := url.Parse(in.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("smsstub: an inbound message's url must be an absolute http or https URL")
	}
	switch in.Shape {
	case "generic":
		if len(s.receipts.Secret) == 0 {
			return nil, errors.New("smsstub: a generic inbound message is signed with Receipts.Secret, which is not set")
		}
		body := mustJSON(map[string]string{"id": "in_" + randomHex(12), "from": in.From, "to": in.To, "text": in.Text})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, in.URL, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(receiver.HeaderSignature, receiver.SignGeneric(s.receipts.Secret, body, time.Now()))
		return req, nil
	case "twilio":
		if s.twilio.AccountSID == "" {
			return nil, errors.New("smsstub: a Twilio inbound message is signed with Twilio.AuthToken: the facade is not configured")
		}
		sid := "SM" + randomHex(16)
		form := url.Values{
			"MessageSid": {sid}, "SmsMessageSid": {sid}, "SmsSid": {sid}, "AccountSid": {s.twilio.AccountSID},
			"From": {in.From}, "To": {in.To}, "Body": {in.Text}, "NumMedia": {"0"}, "NumSegments": {"1"},
			"SmsStatus": {"received"}, "ApiVersion": {"2010-04-01"},
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, in.URL, strings.NewReader(form.Encode()))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(receiver.HeaderTwilioSignature, receiver.SignTwilio(s.twilio.AuthToken, in.URL, form))
		return req, nil
	}
	return nil, fmt.Errorf("smsstub: an inbound message's shape is generic or twilio, not %q", in.Shape)
}

// OptOut makes the stub refuse every message to number, at the generic
// API and at the Twilio facade, with 400 code CodeOptedOut (Twilio's
// 21610): nothing is delivered, as at a provider that blocks a recipient
// who opted out. A key already taken still gets its replay.
func (s *Server) OptOut(number string) {
	s.mu.Lock()
	s.optedOut[number] = true
	s.mu.Unlock()
}

// OptIn lifts OptOut for number.
func (s *Server) OptIn(number string) {
	s.mu.Lock()
	delete(s.optedOut, number)
	s.mu.Unlock()
}

// maxInboundBytes bounds a POST /admin/inbound body.
const maxInboundBytes = 16 << 10

// handleInbound serves POST /admin/inbound: an Inbound as JSON, sent at
// once; it answers {"status": <the receiver's HTTP status>}.
func (s *Server) handleInbound(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInboundBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, http.StatusBadRequest, "could not read request body")
		return
	}
	var in Inbound
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, http.StatusBadRequest, "an inbound message is {\"url\",\"shape\",\"from\",\"to\",\"text\"}")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	status, err := s.SendInbound(ctx, in)
	if err != nil {
		writeError(w, http.StatusBadGateway, http.StatusBadGateway, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, mustJSON(map[string]int{"status": status}))
}
