package receiver

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/backoff"
	"github.com/sendonce/sendonce/internal/outbox"
)

// Inbound messages: what recipients reply. A reply that is, as a whole
// (trimmed, in any case), an opt-out keyword puts its sender's number on
// the suppression list; an opt-in keyword lifts it (docs/consent.md).
// Nothing else is kept: not the text, not the number of a reply that is no
// keyword. Each provider's inbound webhook is verified exactly as its
// receipts are, and answered 2xx only once its effect is committed.
//
//	POST /v1/inbound/generic  {"id","from","to","text"}, Sendonce-Signature
//	POST /v1/inbound/twilio   Twilio's incoming-message request (From, Body), X-Twilio-Signature
//	POST /v1/inbound/vonage   the Messages API's inbound message (from, text), a signed JWT
//	POST /v1/inbound/sinch    an MO callback (type mo_text: from, body), Sinch's HMAC
//	POST /v1/inbound/telnyx   a message.received webhook (payload.from.phone_number, payload.text), Ed25519
//
// Sinch and Telnyx send a profile's or a service plan's inbound messages
// and delivery reports to one URL: an inbound message that reaches their
// receipts' endpoint is taken there too.

// The CTIA's keywords (the Messaging Principles and Best Practices, which
// carriers audit), each the whole message: the opt-outs stop every message
// to the number, the opt-ins resume them. HELP is answered by the
// provider, and changes nothing here.
var (
	optOutKeywords = []string{"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT"}
	optInKeywords  = []string{"START", "UNSTOP", "YES"}
)

// Keyword returns the keyword text is (upper case), whether it lifts a
// suppression (an opt-in) rather than adding one, and false when text is
// no keyword: only the whole message, trimmed, in any case, counts.
func Keyword(text string) (kw string, lift, ok bool) {
	t := strings.TrimSpace(text)
	if len(t) > 16 {
		return "", false, false
	}
	for i := 0; i < len(t); i++ {
		if c := t[i] | 0x20; c < 'a' || c > 'z' {
			return "", false, false
		}
	}
	t = strings.ToUpper(t)
	for _, k := range optOutKeywords {
		if t == k {
			return k, false, true
		}
	}
	for _, k := range optInKeywords {
		if t == k {
			return k, true, true
		}
	}
	return "", false, false
}

// inboundNumber returns a recipient's number as E.164: "+" and digits, or
// digits alone (Vonage writes numbers without "+"); "" when it is neither
// (a short code, an alphanumeric sender).
func inboundNumber(s string) string {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "+") {
		s = "+" + s
	}
	if !outbox.ValidNumber(s) {
		return ""
	}
	return s
}

// inbound counts a result of an inbound message from source.
func (rv *Receiver) inbound(source string) func(result string) {
	return func(result string) { rv.metrics.inbound.WithLabelValues(source, result).Inc() }
}

// keyword applies a verified inbound message from source: a keyword
// changes the list, anything else is answered and forgotten. from is the
// sender's number as the provider wrote it; text is never logged or kept.
func (rv *Receiver) keyword(w http.ResponseWriter, r *http.Request, source, from, text string) {
	count := rv.inbound(source)
	kw, lift, ok := Keyword(text)
	if !ok {
		count("ignored")
		rv.replyInbound(w, source, http.StatusOK, "ignored")
		return
	}
	number := inboundNumber(from)
	if number == "" {
		// An opt-out from a sender that is no phone number cannot be
		// listed; the provider's own block still holds there.
		count("invalid_number")
		rv.log.Warn("inbound keyword from a sender that is no E.164 number: ignored", "source", source, "keyword", kw)
		rv.replyInbound(w, source, http.StatusOK, "ignored")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), rv.cfg.WriteDeadline)
	defer cancel()
	in := outbox.Inbound{Number: number, Provider: source, Keyword: kw, Lift: lift}
	var res string
	var err error
	for failures := 0; ; failures++ {
		dbCtx, cancel := context.WithTimeout(ctx, rv.cfg.DBTimeout)
		res, err = outbox.ApplyInbound(dbCtx, rv.cfg.Pool, in)
		cancel()
		d := min(time.Second, 50*time.Millisecond<<min(failures, 5))
		if err == nil || ctx.Err() != nil || !backoff.Sleep(ctx, d) {
			break
		}
	}
	if err != nil {
		// Not known to be committed: the provider sends it again, and a
		// keyword applied twice changes nothing the second time.
		count("error")
		rv.log.Warn("inbound keyword not recorded; answered 503 for the provider to send it again", "source", source, "keyword", kw, "err", err)
		reply(w, http.StatusServiceUnavailable, "not recorded; send it again")
		return
	}
	count(res)
	rv.log.Info("inbound keyword", "source", source, "keyword", kw, "result", res)
	rv.replyInbound(w, source, http.StatusOK, res)
}

// replyInbound answers an inbound message: Twilio's with an empty TwiML
// response (no reply message: the provider's own opt-out answer is sent
// by Twilio), the others with the receipts' small JSON.
func (rv *Receiver) replyInbound(w http.ResponseWriter, source string, code int, result string) {
	if source != "twilio" {
		reply(w, code, result)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Response></Response>` + "\n"))
}

// inboundGeneric serves POST /v1/inbound/generic: {"id","from","to","text"},
// signed as a generic receipt is.
func (rv *Receiver) inboundGeneric(w http.ResponseWriter, r *http.Request) {
	count := rv.inbound("generic")
	body, ok := rv.readBody(w, r, count)
	if !ok {
		return
	}
	if err := VerifyGeneric(rv.cfg.Secrets, r.Header.Get(HeaderSignature), body, rv.cfg.Now(), rv.cfg.Tolerance); err != nil {
		rv.refuse(w, count, err)
		return
	}
	var m struct {
		ID   string `json:"id"`
		From string `json:"from"`
		To   string `json:"to"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		rv.malformed(w, count, "inbound message is not the expected JSON")
		return
	}
	rv.keyword(w, r, "generic", m.From, m.Text)
}

// inboundTwilio serves POST /v1/inbound/twilio, Twilio's request for an
// incoming message (form fields From, To, Body, MessageSid, ...), signed
// with X-Twilio-Signature over the URL Twilio called.
func (rv *Receiver) inboundTwilio(w http.ResponseWriter, r *http.Request) {
	count := rv.inbound("twilio")
	body, ok := rv.readBody(w, r, count)
	if !ok {
		return
	}
	params, err := parseForm(body)
	if err != nil {
		rv.malformed(w, count, "body is not a form")
		return
	}
	full := strings.TrimRight(rv.cfg.PublicURL, "/") + r.URL.RequestURI()
	if err := VerifyTwilio(rv.cfg.TwilioToken, full, params, r.Header.Get(HeaderTwilioSignature)); err != nil {
		rv.refuse(w, count, err)
		return
	}
	rv.keyword(w, r, "twilio", params.Get("From"), params.Get("Body"))
}

// inboundVonage serves POST /v1/inbound/vonage, the Messages API's inbound
// message (the document's inboundMessageSMS: channel, message_uuid, to,
// from, timestamp, text), signed as Vonage's status webhooks are.
func (rv *Receiver) inboundVonage(w http.ResponseWriter, r *http.Request) {
	count := rv.inbound("vonage")
	body, ok := rv.readBody(w, r, count)
	if !ok {
		return
	}
	if err := VerifyVonage(rv.cfg.VonageSecret, r.Header.Get(HeaderVonageAuthorization), body, rv.cfg.Now(), rv.cfg.Tolerance); err != nil {
		rv.refuse(w, count, err)
		return
	}
	var m struct {
		Channel string `json:"channel"`
		From    string `json:"from"`
		Text    string `json:"text"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		rv.malformed(w, count, "inbound message is not the expected JSON")
		return
	}
	if m.Channel != "" && m.Channel != "sms" {
		count("ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	rv.keyword(w, r, "vonage", m.From, m.Text)
}

// sinchInbound is a Sinch MO callback (inboundsObject: type mo_text or
// mo_binary, id, from, to, body).
type sinchInbound struct {
	Type string `json:"type"`
	From string `json:"from"`
	Body string `json:"body"`
}

// inboundSinch serves POST /v1/inbound/sinch, signed as Sinch's delivery
// reports are.
func (rv *Receiver) inboundSinch(w http.ResponseWriter, r *http.Request) {
	count := rv.inbound("sinch")
	body, ok := rv.readBody(w, r, count)
	if !ok {
		return
	}
	if err := VerifySinch(rv.cfg.SinchSecret, r.Header, body, rv.cfg.Now(), rv.cfg.Tolerance); err != nil {
		rv.refuse(w, count, err)
		return
	}
	var m sinchInbound
	if err := json.Unmarshal(body, &m); err != nil {
		rv.malformed(w, count, "inbound message is not the expected JSON")
		return
	}
	rv.sinchKeyword(w, r, m)
}

// sinchKeyword applies a verified MO; a binary one (or anything else) is
// no keyword.
func (rv *Receiver) sinchKeyword(w http.ResponseWriter, r *http.Request, m sinchInbound) {
	if m.Type != "mo_text" {
		rv.inbound("sinch")("ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	rv.keyword(w, r, "sinch", m.From, m.Body)
}

// telnyxInbound is a Telnyx message.received webhook (InboundMessageEvent).
type telnyxInbound struct {
	Data struct {
		EventType string `json:"event_type"`
		Payload   struct {
			Direction string `json:"direction"`
			From      struct {
				PhoneNumber string `json:"phone_number"`
			} `json:"from"`
			Text string `json:"text"`
		} `json:"payload"`
	} `json:"data"`
}

// inboundTelnyx serves POST /v1/inbound/telnyx, signed as Telnyx's
// message webhooks are.
func (rv *Receiver) inboundTelnyx(w http.ResponseWriter, r *http.Request) {
	count := rv.inbound("telnyx")
	body, ok := rv.readBody(w, r, count)
	if !ok {
		return
	}
	if err := VerifyTelnyx(rv.cfg.TelnyxPublicKey, r.Header.Get(HeaderTelnyxSignature), r.Header.Get(HeaderTelnyxTimestamp), body, rv.cfg.Now(), rv.cfg.Tolerance); err != nil {
		rv.refuse(w, count, err)
		return
	}
	var m telnyxInbound
	if err := json.Unmarshal(body, &m); err != nil {
		rv.malformed(w, count, "webhook is not the expected JSON")
		return
	}
	rv.telnyxKeyword(w, r, m)
}

// telnyxKeyword applies a verified message.received webhook; any other
// event is answered and ignored.
func (rv *Receiver) telnyxKeyword(w http.ResponseWriter, r *http.Request, m telnyxInbound) {
	if m.Data.EventType != "message.received" || (m.Data.Payload.Direction != "" && m.Data.Payload.Direction != "inbound") {
		rv.inbound("telnyx")("ignored")
		reply(w, http.StatusOK, "ignored")
		return
	}
	rv.keyword(w, r, "telnyx", m.Data.Payload.From.PhoneNumber, m.Data.Payload.Text)
}
