package smsstub

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sendonce/sendonce/internal/receiver"
)

// twilioPath is Twilio's Messages list resource; {account} is the
// AccountSid.
const twilioPath = "/2010-04-01/Accounts/{account}/Messages.json"

// DefaultTwilioQueueFor is Twilio.QueueFor's default.
const DefaultTwilioQueueFor = 500 * time.Millisecond

// TwilioPoolNumber is the From a message sent through a messaging service
// shows once it has left the queue: the service picked it from its pool,
// so it is not a number the sender named.
const TwilioPoolNumber = "+15005550006"

// Error codes of the Twilio facade, Twilio's own; the others are the
// generic API's (CodeInvalidTo, CodeBodyRequired, CodeBodyTooLong,
// CodeAuthFailed, CodeRateLimited), which Twilio shares.
const (
	// CodeTwilioNotFound accompanies 404: another account's resource.
	CodeTwilioNotFound = 20404
	// CodeTwilioInvalid accompanies 400 for a malformed parameter.
	CodeTwilioInvalid = 20001
	// CodeTwilioFromRequired accompanies 400 when neither From nor
	// MessagingServiceSid is given.
	CodeTwilioFromRequired = 21603
	// CodeTwilioBadCallback accompanies 400 for a StatusCallback that is
	// not an absolute http(s) URL.
	CodeTwilioBadCallback = 21609
)

// Twilio configures the Twilio-compatible facade: the Messages resource of
// Twilio's API (see the package documentation), so that the sender's real
// Twilio adapter, its lookup and the receiver's status callbacks can be
// run against the stub over HTTP. The zero value serves none of it.
type Twilio struct {
	// AccountSID is the account served (the basic-auth user and the
	// {AccountSid} of the path); empty disables the facade. It must not
	// hold "/", "?" or "#".
	AccountSID string
	// AuthToken is the basic-auth password, and the key that signs status
	// callbacks (X-Twilio-Signature); required with AccountSID.
	AuthToken string
	// QueueFor is how long a message stays queued (accepted, when sent
	// through a messaging service) after it is taken, with no date_sent;
	// it is sent then, and its fate is known Receipts.Delay later. Zero
	// means DefaultTwilioQueueFor.
	QueueFor time.Duration
}

func (t Twilio) normalized() (Twilio, error) {
	t.QueueFor = cmp.Or(t.QueueFor, DefaultTwilioQueueFor)
	switch {
	case t.AccountSID == "":
		return Twilio{}, nil
	case strings.ContainsAny(t.AccountSID, "/?#"):
		return t, errors.New("invalid Twilio.AccountSID: it must not hold /, ? or #")
	case t.AuthToken == "":
		return t, errors.New("Twilio.AuthToken is required with Twilio.AccountSID")
	case t.QueueFor < 0:
		return t, fmt.Errorf("invalid Twilio.QueueFor %v: must not be negative", t.QueueFor)
	}
	return t, nil
}

// twilioError is the body of every error the facade answers, Twilio's
// shape.
type twilioError struct {
	Code     int    `json:"code"`
	Message  string `json:"message"`
	MoreInfo string `json:"more_info"`
	Status   int    `json:"status"`
}

// writeTwilioError answers an error as Twilio does; a zero code, or one
// that is an HTTP status, becomes 20000 and the status (20500, 20503, ...).
func writeTwilioError(w http.ResponseWriter, status, code int, message string) {
	if code < 1000 {
		code = 20000 + status
	}
	writeJSON(w, status, mustJSON(twilioError{Code: code, Message: message,
		MoreInfo: "https://www.twilio.com/docs/errors/" + strconv.Itoa(code), Status: status}))
}

// twilioAuthorized reports whether r carries the facade's credentials.
func (s *Server) twilioAuthorized(r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	// Both compared, in constant time, whatever the first says.
	u := subtle.ConstantTimeCompare([]byte(user), []byte(s.twilio.AccountSID))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(s.twilio.AuthToken))
	return ok && u&p == 1
}

// twilioGate answers what fails authentication or names another account,
// and reports whether the request may go on.
func (s *Server) twilioGate(w http.ResponseWriter, r *http.Request) bool {
	if !s.twilioAuthorized(r) {
		w.Header().Set("WWW-Authenticate", `Basic realm="Twilio API"`)
		s.reject(r.Context(), w, shapeTwilio, "", false, http.StatusUnauthorized, CodeAuthFailed, "Authenticate")
		return false
	}
	if r.PathValue("account") != s.twilio.AccountSID {
		s.reject(r.Context(), w, shapeTwilio, "", false, http.StatusNotFound, CodeTwilioNotFound,
			"The requested resource "+r.URL.Path+" was not found")
		return false
	}
	return true
}

// handleTwilioCreate serves POST .../Messages.json: form fields To, From or
// MessagingServiceSid, Body and StatusCallback. It is never idempotent:
// every request that gets past the faults is a new message. Its delivery
// key is StatusCallback's ref parameter (the outbox id the sender's adapter
// puts there); without one, "body:" and a hash of To and Body.
func (s *Server) handleTwilioCreate(w http.ResponseWriter, r *http.Request) {
	if !s.twilioGate(w, r) {
		return
	}
	ctx := r.Context()
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
		s.reject(ctx, w, shapeTwilio, "", false, http.StatusBadRequest, CodeTwilioInvalid,
			"Content-Type must be application/x-www-form-urlencoded")
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		s.reject(ctx, w, shapeTwilio, "", false, http.StatusRequestEntityTooLarge, 0,
			"request body larger than "+strconv.Itoa(MaxRequestBytes)+" bytes")
		return
	}
	form, err := url.ParseQuery(string(raw))
	if err != nil {
		s.reject(ctx, w, shapeTwilio, "", false, http.StatusBadRequest, CodeTwilioInvalid, "the body is not a form")
		return
	}
	msg := messageRequest{To: form.Get("To"), Body: form.Get("Body"), From: form.Get("From"),
		Service: form.Get("MessagingServiceSid"), CallbackURL: form.Get("StatusCallback")}
	key := twilioKey(&msg)
	validity, validityOK := twilioValidity(form)
	msg.ValidityPeriod = validity
	switch n := utf8.RuneCountInString(msg.Body); {
	case !validE164(msg.To):
		// Twilio echoes the number: the adapter must not pass it on.
		s.reject(ctx, w, shapeTwilio, key, true, http.StatusBadRequest, CodeInvalidTo,
			"The 'To' number "+msg.To+" is not a valid phone number.")
	case msg.From == "" && msg.Service == "":
		s.reject(ctx, w, shapeTwilio, key, true, http.StatusBadRequest, CodeTwilioFromRequired, "A 'From' phone number is required.")
	case n == 0:
		s.reject(ctx, w, shapeTwilio, key, true, http.StatusBadRequest, CodeBodyRequired, "Message body is required.")
	case n > MaxBodyChars:
		s.reject(ctx, w, shapeTwilio, key, true, http.StatusBadRequest, CodeBodyTooLong,
			"The concatenated message body exceeds the "+strconv.Itoa(MaxBodyChars)+" character limit.")
	case msg.CallbackURL != "" && !validCallback(msg.CallbackURL):
		s.reject(ctx, w, shapeTwilio, key, true, http.StatusBadRequest, CodeTwilioBadCallback, "The StatusCallback URL is not valid.")
	case !validityOK:
		s.reject(ctx, w, shapeTwilio, key, true, http.StatusBadRequest, CodeTwilioInvalid,
			"ValidityPeriod must be an integer from "+strconv.Itoa(twilioMinValidity)+" to "+strconv.Itoa(twilioMaxValidity)+".")
	default:
		s.process(w, r, shapeTwilio, key, nil, msg)
	}
}

// The bounds of ValidityPeriod, in seconds, as Twilio's OpenAPI document
// gives them: "Accepted values are integers from `1` to `36000`."
const (
	twilioMinValidity = 1
	twilioMaxValidity = 36000
)

// twilioValidity reads a create's ValidityPeriod: 0 and true when it has
// none; the seconds and true when it is an integer within the document's
// bounds; false for anything else.
func twilioValidity(form url.Values) (int, bool) {
	if !form.Has("ValidityPeriod") {
		return 0, true
	}
	n, err := strconv.Atoi(form.Get("ValidityPeriod"))
	return n, err == nil && n >= twilioMinValidity && n <= twilioMaxValidity
}

// twilioKey returns a Twilio request's delivery key, and sets its
// reference (for Messages) to StatusCallback's ref.
func twilioKey(msg *messageRequest) string {
	if u, err := url.Parse(msg.CallbackURL); err == nil && msg.CallbackURL != "" {
		if ref := u.Query().Get("ref"); ref != "" {
			msg.Reference = ref
			return ref
		}
	}
	h := sha256.Sum256([]byte(msg.To + "\x00" + msg.Body))
	return "body:" + hex.EncodeToString(h[:16])
}

// twilioMessage is a Message resource as Twilio answers it.
type twilioMessage struct {
	AccountSID      string            `json:"account_sid"`
	APIVersion      string            `json:"api_version"`
	Body            string            `json:"body"`
	DateCreated     string            `json:"date_created"`
	DateSent        *string           `json:"date_sent"`
	DateUpdated     string            `json:"date_updated"`
	Direction       string            `json:"direction"`
	ErrorCode       *int              `json:"error_code"`
	ErrorMessage    *string           `json:"error_message"`
	From            *string           `json:"from"`
	ServiceSID      *string           `json:"messaging_service_sid"`
	NumMedia        string            `json:"num_media"`
	NumSegments     string            `json:"num_segments"`
	Price           *string           `json:"price"`
	PriceUnit       string            `json:"price_unit"`
	SID             string            `json:"sid"`
	Status          string            `json:"status"`
	SubresourceURIs map[string]string `json:"subresource_uris"`
	To              string            `json:"to"`
	URI             string            `json:"uri"`
}

// twilioDate formats t as Twilio does (RFC 2822, GMT, numeric zone).
func twilioDate(t time.Time) string { return t.UTC().Format(time.RFC1123Z) }

// twilioResource is m as Twilio shows it at now: no date_sent while it is
// queued, and From the pool's number once a messaging service sent it.
func (s *Server) twilioResource(m *message, now time.Time) twilioMessage {
	base := "/2010-04-01/Accounts/" + s.twilio.AccountSID + "/Messages/" + m.id
	out := twilioMessage{
		AccountSID: s.twilio.AccountSID, APIVersion: "2010-04-01", Body: m.body,
		DateCreated: twilioDate(m.created), DateUpdated: twilioDate(m.created), Direction: "outbound-api",
		NumMedia: "0", NumSegments: "1", PriceUnit: "USD", SID: m.id, Status: m.statusAt(now), To: m.to,
		SubresourceURIs: map[string]string{"media": base + "/Media.json", "feedback": base + "/Feedback.json"},
		URI:             base + ".json",
	}
	if m.from != "" {
		out.From = &m.from
	}
	if m.service != "" {
		out.ServiceSID = &m.service
	}
	if !now.Before(m.sentAt) {
		sent := twilioDate(m.sentAt)
		out.DateSent, out.DateUpdated = &sent, sent
		if m.from == "" {
			pool := TwilioPoolNumber
			out.From = &pool
		}
	}
	if !now.Before(m.fateAt) {
		out.DateUpdated = twilioDate(m.fateAt)
		if m.fate == "undelivered" {
			code, text := CodeUndelivered, "Unreachable destination handset"
			out.ErrorCode, out.ErrorMessage = &code, &text
		}
	}
	return out
}

// twilioPage is the answer of GET .../Messages.json.
type twilioPage struct {
	FirstPageURI    string          `json:"first_page_uri"`
	End             int             `json:"end"`
	PreviousPageURI *string         `json:"previous_page_uri"`
	Messages        []twilioMessage `json:"messages"`
	URI             string          `json:"uri"`
	PageSize        int             `json:"page_size"`
	Start           int             `json:"start"`
	NextPageURI     *string         `json:"next_page_uri"`
	Page            int             `json:"page"`
}

// twilioDateFilter is one of the DateSent filters: DateSent=D (sent that
// day), DateSent<=D (on or before it) and DateSent>=D (on or after it). In
// a query string "DateSent>=D" is the parameter "DateSent>" with the value
// D, and so Twilio documents it. D is a date (YYYY-MM-DD, GMT) or an
// RFC 3339 time.
type twilioDateFilter struct {
	op       byte // '=', '<' or '>'
	from, to time.Time
}

// parseTwilioDate reads a DateSent value as the interval [from, to) it
// names: the whole day for a date.
func parseTwilioDate(v string) (time.Time, time.Time, error) {
	if d, err := time.Parse(time.DateOnly, v); err == nil {
		return d, d.AddDate(0, 0, 1), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	return t, t.Add(time.Second), err
}

// match reports whether a message sent at sent (zero: not sent yet)
// passes the filter. A message not sent has no date_sent and passes none.
func (f twilioDateFilter) match(sent time.Time) bool {
	switch {
	case sent.IsZero():
		return false
	case f.op == '<':
		return sent.Before(f.to)
	case f.op == '>':
		return !sent.Before(f.from)
	}
	return !sent.Before(f.from) && sent.Before(f.to)
}

// handleTwilioList serves GET .../Messages.json: the account's messages,
// filtered by To, From and DateSent (=, <=, >=), PageSize (default 50, at
// most 1000) to a page, newest first as Twilio documents it: by date_sent.
// Where a message not sent yet goes Twilio does not say; here such
// messages come after every sent one (the newest created first), the order
// that breaks a client assuming the list is by creation. next_page_uri
// carries the filters, Page and PageToken (PA and the last message's
// sid); the next page starts after that message.
func (s *Server) handleTwilioList(w http.ResponseWriter, r *http.Request) {
	if !s.twilioGate(w, r) {
		return
	}
	q := r.URL.Query()
	size := 50
	if v := q.Get("PageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeTwilioError(w, http.StatusBadRequest, CodeTwilioInvalid, "PageSize must be 1 to 1000")
			return
		}
		size = n
	}
	page, _ := strconv.Atoi(q.Get("Page"))
	var filters []twilioDateFilter
	for _, op := range []string{"", "<", ">"} {
		v := q.Get("DateSent" + op)
		if v == "" {
			continue
		}
		from, to, err := parseTwilioDate(v)
		if err != nil {
			writeTwilioError(w, http.StatusBadRequest, CodeTwilioInvalid, "DateSent"+op+" is not a date")
			return
		}
		f := twilioDateFilter{op: '=', from: from, to: to}
		if op != "" {
			f.op = op[0]
		}
		filters = append(filters, f)
	}
	to, from := q.Get("To"), q.Get("From")

	now := time.Now()
	s.mu.Lock()
	s.stats.Lookups++
	if f := s.faults; f.LookupFailRate > 0 && s.rng.Float64() < f.LookupFailRate {
		s.stats.LookupFailures++
		s.mu.Unlock()
		writeTwilioError(w, http.StatusInternalServerError, 0, "injected lookup failure")
		return
	}
	var list []twilioMessage
	sentAt := map[string]time.Time{}
	for _, m := range s.twilioMsgs {
		// A lookup lists one number's messages: the others are passed
		// over before their resource is built, which under s.mu took
		// 100 ms a page in an account of 100,000 messages.
		if to != "" && m.to != to {
			continue
		}
		res := s.twilioResource(m, now)
		var sent time.Time
		if res.DateSent != nil {
			sent = m.sentAt
		}
		keep := from == "" || (res.From != nil && *res.From == from)
		for _, f := range filters {
			keep = keep && f.match(sent)
		}
		if keep {
			list = append(list, res)
			sentAt[m.id] = sent
		}
	}
	s.mu.Unlock()
	// s.twilioMsgs is in creation order: the newest created first, then
	// the sent ones by date_sent, newest first, before every unsent one.
	slices.Reverse(list)
	slices.SortStableFunc(list, func(a, b twilioMessage) int {
		sa, sb := sentAt[a.SID], sentAt[b.SID]
		switch {
		case sa.IsZero() != sb.IsZero():
			if sa.IsZero() {
				return 1
			}
			return -1
		}
		return sb.Compare(sa)
	})

	start := page * size
	if tok := q.Get("PageToken"); strings.HasPrefix(tok, "PA") {
		if i := slices.IndexFunc(list, func(m twilioMessage) bool { return m.SID == tok[2:] }); i >= 0 {
			start = i + 1
		}
	}
	start = min(start, len(list))
	end := min(start+size, len(list))
	base := strings.Replace(twilioPath, "{account}", s.twilio.AccountSID, 1)
	keep := url.Values{}
	for k, vs := range q {
		if k != "Page" && k != "PageToken" && k != "PageSize" {
			keep[k] = vs
		}
	}
	pageURI := func(n int, token string) string {
		v := url.Values{}
		for k, vs := range keep {
			v[k] = vs
		}
		v.Set("PageSize", strconv.Itoa(size))
		v.Set("Page", strconv.Itoa(n))
		if token != "" {
			v.Set("PageToken", token)
		}
		return base + "?" + v.Encode()
	}
	out := twilioPage{
		FirstPageURI: pageURI(0, ""), URI: pageURI(page, q.Get("PageToken")), PageSize: size,
		Start: start, End: max(start, end-1), Page: page, Messages: list[start:end],
	}
	if out.Messages == nil {
		out.Messages = []twilioMessage{}
	}
	if end < len(list) {
		next := pageURI(page+1, "PA"+list[end-1].SID)
		out.NextPageURI = &next
	}
	writeJSON(w, http.StatusOK, mustJSON(out))
}

// twilioCallback is m's status callback of status to callback, as Twilio
// sends it: a form signed with X-Twilio-Signature over the callback URL
// and the fields.
func (s *Server) twilioCallback(ctx context.Context, m *message, callback, status string) (*http.Request, error) {
	res := s.twilioResource(m, m.fateAt)
	form := url.Values{
		"MessageSid": {m.id}, "SmsSid": {m.id}, "AccountSid": {s.twilio.AccountSID},
		"MessageStatus": {status}, "SmsStatus": {status}, "To": {m.to}, "ApiVersion": {"2010-04-01"},
	}
	if res.From != nil {
		form.Set("From", *res.From)
	}
	if m.service != "" {
		form.Set("MessagingServiceSid", m.service)
	}
	if status == "undelivered" {
		form.Set("ErrorCode", strconv.Itoa(CodeUndelivered))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, callback, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set(receiver.HeaderTwilioSignature, receiver.SignTwilio(s.twilio.AuthToken, callback, form))
	return req, nil
}
