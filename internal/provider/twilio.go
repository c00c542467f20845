package provider

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/mail"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/safetext"
)

// TwilioConfig configures the Twilio adapter.
type TwilioConfig struct {
	// BaseURL is the API's base URL; default https://api.twilio.com.
	BaseURL string
	// AccountSID and AuthToken are the basic-auth credentials; required.
	AccountSID, AuthToken string
	// From is the sending number or alphanumeric sender id; required
	// unless MessagingServiceSID is set.
	From string
	// MessagingServiceSID, when set, is sent instead of From.
	MessagingServiceSID string
	// ReceiptsURL, when set, asks Twilio for status callbacks at
	// ReceiptsURL/v1/receipts/twilio?ref=<row id>, so that a receipt finds
	// its row even when the create response was lost.
	ReceiptsURL string
	// Lookup enables Lookup: Twilio's messages to the number (from From,
	// unless MessagingServiceSID is set: a service picks the From itself)
	// created since the row, with the same text (safetext.SameText).
	// Twilio keeps no reference of ours and does not say where a message
	// not sent yet sorts in its list, so a lookup reads every page of the
	// number's messages.
	Lookup bool
	// LookupPageSize is the messages asked for per page of the list
	// (Twilio's PageSize), 1 to 1000; default
	// DefaultTwilioLookupPageSize.
	LookupPageSize int
	// LookupPages caps the pages one lookup reads; a list with more is an
	// error (ErrLookupIncomplete), never an answer. Default
	// DefaultTwilioLookupPages: with the default page size, numbers with up
	// to 1,000 messages from the sender are looked up.
	LookupPages int
	// Timeout, ConnectTimeout, PermanentCodes, MaxConns, MaxRetryAfter and
	// Transport are as in Config.
	Timeout, ConnectTimeout time.Duration
	PermanentCodes          []int
	MaxConns                int
	MaxRetryAfter           time.Duration
	Transport               http.RoundTripper
}

// Defaults of the Twilio lookup.
const (
	// DefaultTwilioLookupPageSize is TwilioConfig.LookupPageSize's default.
	DefaultTwilioLookupPageSize = 100
	// DefaultTwilioLookupPages is TwilioConfig.LookupPages's default.
	DefaultTwilioLookupPages = 10
	// maxTwilioMessageBytes bounds one message of a page of Twilio's
	// list: 1,600 characters each escaped as a surrogate pair (12 bytes),
	// and Twilio's 1 KiB of other fields. A page may hold its PageSize of
	// them, and 64 KiB more.
	maxTwilioMessageBytes = 20 << 10
)

// NewTwilio returns a client for Twilio's Messages API:
// POST {BaseURL}/2010-04-01/Accounts/{AccountSid}/Messages.json with form
// fields To, From (or MessagingServiceSid) and Body, basic auth, and
// Twilio's error JSON {"code","message","more_info","status"}.
//
// A message with an expiry carries ValidityPeriod, the time left in whole
// seconds (twilioValidityPeriod): how long Twilio may keep it queued
// before it gives up on it (Twilio's error 30036) rather than send it late.
//
// An answer with error 21610 (the recipient opted out) is Permanent and
// OptedOut (optout.go).
//
// Twilio documents that creating a message is not idempotent, so the client
// always runs in non-idempotent mode: an outcome that may have reached
// Twilio is Ambiguous (the row ends unknown), never retried.
func NewTwilio(cfg TwilioConfig) (*Client, error) {
	a := adapter{name: "twilio", base: "https://api.twilio.com", path: twilioMessagesPath(cfg.AccountSID)}
	c, err := a.newClient(Config{BaseURL: cfg.BaseURL, ReceiptsURL: cfg.ReceiptsURL, Timeout: cfg.Timeout, ConnectTimeout: cfg.ConnectTimeout,
		PermanentCodes: cfg.PermanentCodes, MaxConns: cfg.MaxConns, MaxRetryAfter: cfg.MaxRetryAfter, Transport: cfg.Transport},
		a.required("AccountSID", cfg.AccountSID),
		a.required("AuthToken", cfg.AuthToken),
		a.required("From or MessagingServiceSID", cfg.From, cfg.MessagingServiceSID),
		a.invalid(strings.ContainsAny(cfg.AccountSID, "/?#"), "AccountSID is malformed"),
		a.pageSize(cfg.LookupPageSize, 1000),
		a.pages(cfg.LookupPages))
	if err != nil {
		return nil, err
	}
	cfg.LookupPageSize = cmp.Or(cfg.LookupPageSize, DefaultTwilioLookupPageSize)
	cfg.LookupPages = cmp.Or(cfg.LookupPages, DefaultTwilioLookupPages)
	c.auth = basicAuth(cfg.AccountSID, cfg.AuthToken)
	c.refField = "sid"
	c.newRequest = func(ctx context.Context, m Message, now time.Time) (*http.Request, error) {
		form := url.Values{"To": {m.To}, "Body": {m.Body}}
		if !m.ExpiresAt.IsZero() {
			form.Set("ValidityPeriod", strconv.Itoa(twilioValidityPeriod(m.ExpiresAt.Sub(now))))
		}
		if cfg.ReceiptsURL != "" {
			form.Set("StatusCallback", receiptsAt(cfg.ReceiptsURL, "/v1/receipts/twilio?ref="+url.QueryEscape(m.Key)))
		}
		if cfg.MessagingServiceSID != "" {
			form.Set("MessagingServiceSid", cfg.MessagingServiceSID)
		} else {
			form.Set("From", cfg.From)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, strings.NewReader(form.Encode()))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Accept", "application/json")
		return req, nil
	}
	c.byContent = true
	if cfg.Lookup {
		c.lookup = func(ctx context.Context, q LookupQuery) ([]Found, error) { return c.twilioLookup(ctx, cfg, q) }
	}
	return c, nil
}

// twilioMessagesPath is the account's Messages resource, under the API's
// base URL: where messages are created, and listed.
func twilioMessagesPath(accountSID string) string {
	return "/2010-04-01/Accounts/" + url.PathEscape(accountSID) + "/Messages.json"
}

// The bounds of CreateMessage's ValidityPeriod, in seconds, as the
// document gives them in words (the schema says only "integer"):
// "Accepted values are integers from `1` to `36000`. Default value is
// `36000`."
const (
	twilioMinValidity = 1
	twilioMaxValidity = 36000
)

// twilioValidityPeriod is the ValidityPeriod that tells Twilio a message
// has left time left, in whole seconds: rounded down, so Twilio is never
// given more time than is left; at least twilioMinValidity, so that a
// message with less than a second left still goes, with the shortest
// period Twilio takes (a smaller one is refused: Twilio's error 30012,
// "TTL is too small"); at most twilioMaxValidity, which is also Twilio's
// default, so a message with more time left is given what it would get
// without the parameter, never more than it has.
func twilioValidityPeriod(left time.Duration) int {
	return int(max(twilioMinValidity, min(twilioMaxValidity, left/time.Second)))
}

// twilioPage is one page of Twilio's Messages list, as the lookup reads it.
type twilioPage struct {
	Messages []struct {
		SID         string `json:"sid"`
		Body        string `json:"body"`
		Status      string `json:"status"`
		DateCreated string `json:"date_created"`
	} `json:"messages"`
	NextPageURI string `json:"next_page_uri"`
}

// twilioLookup reads every page of Twilio's messages to q.To (from
// cfg.From, when no messaging service picks it) and returns those created
// since q.Since, less LookupMargin, with q.Body's text (safetext.SameText).
//
// Twilio documents its list as "sorted by the DateSent field, with the most
// recent messages appearing first", and does not say where a message
// without date_sent (queued, accepted, scheduled) goes. So no DateSent
// filter is sent (it would leave out the queued messages this lookup is
// for), creation times are compared here, and no page can be known to be
// the last that matters: every page is read, up to cfg.LookupPages; more is
// ErrLookupIncomplete. And when there was more than one page, the first is
// read again: a message sent while the lookup paged moved from the unread
// end (no date_sent) to the front (the newest date_sent), already read.
func (c *Client) twilioLookup(ctx context.Context, cfg TwilioConfig, q LookupQuery) ([]Found, error) {
	params := url.Values{"To": {q.To}, "PageSize": {strconv.Itoa(cfg.LookupPageSize)}}
	if cfg.From != "" && cfg.MessagingServiceSID == "" {
		params.Set("From", cfg.From)
	}
	resource := twilioMessagesPath(cfg.AccountSID)
	first := resource + "?" + params.Encode()
	var (
		out   []Found
		seen  = map[string]bool{}
		since = q.Since.Add(-LookupMargin)
	)
	read := func(uri string) (string, error) {
		// Relative to the API, and the same resource: a next page
		// elsewhere is not a page of this list.
		if p, _, _ := strings.Cut(uri, "?"); p != resource {
			return "", fmt.Errorf("%w: a next page outside the Messages list", ErrLookupIncomplete)
		}
		var page twilioPage
		limit := cfg.LookupPageSize*maxTwilioMessageBytes + 64<<10
		if err := c.getJSON(ctx, strings.TrimRight(c.cfg.BaseURL, "/")+uri, limit, &page); err != nil {
			return "", err
		}
		for _, m := range page.Messages {
			if !safetext.SameText(m.Body, q.Body) {
				continue
			}
			status, sent := twilioStatus(m.Status)
			if !sent {
				continue // canceled before sending, or inbound
			}
			// Ours or not is told by the creation time: one that cannot
			// be read, or a sid that cannot be stored, leaves the answer
			// open.
			created, err := mail.ParseDate(m.DateCreated)
			switch {
			case err != nil:
				return "", fmt.Errorf("%w: a message's date_created is unreadable", ErrLookupIncomplete)
			case !q.Since.IsZero() && created.Before(since):
				continue
			case !plainRef(m.SID):
				return "", fmt.Errorf("%w: a message's sid is unusable", ErrLookupIncomplete)
			case seen[m.SID]:
				continue
			}
			seen[m.SID] = true
			out = append(out, Found{Ref: m.SID, Status: status, Created: created})
		}
		return page.NextPageURI, nil
	}
	next, pages := first, 0
	for next != "" {
		if pages == cfg.LookupPages {
			return nil, fmt.Errorf("%w: the number has more than %d pages of %d messages", ErrLookupIncomplete, pages, cfg.LookupPageSize)
		}
		var err error
		if next, err = read(next); err != nil {
			return nil, err
		}
		pages++
	}
	if pages > 1 {
		if _, err := read(first); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// twilioStatus maps the status of a message in Twilio's list (the
// document's message_enum_status) to what a lookup records: accepted,
// delivered or undelivered; sent is false for a message that was never
// sent for a row, which the lookup does not count.
//
//   - queued, sending, sent, accepted, scheduled: Twilio has the message
//     and has not reported its fate; partially_delivered too (some of it
//     reached the phone, and the rest may yet): accepted.
//   - delivered, read: delivered.
//   - undelivered (the carrier could not deliver it) and failed (Twilio
//     took it and could not send it: queue overflow, a suspended account,
//     an unsubscribed number): undelivered, final. The status callback of
//     the same message says the same (the receiver maps them alike); a
//     lookup that called it nothing would send the message again while
//     its receipt ends the row undelivered.
//   - canceled: Twilio canceled it before sending (it cancels only a
//     scheduled message, on request): the message never went out, so the
//     lookup counts it as nothing, and a row with nothing else is sent
//     again under the same reference or, its attempts spent, ends dead.
//     The receiver ignores its callback.
//   - receiving, received: an inbound message, not one sent for a row.
//   - anything else (a status Twilio adds later): accepted, with caution:
//     Twilio has something, so the row is never sent again on its account.
func twilioStatus(s string) (status string, sent bool) {
	switch strings.ToLower(s) {
	case "canceled", "receiving", "received":
		return "", false
	case "delivered", "read":
		return "delivered", true
	case "undelivered", "failed":
		return "undelivered", true
	}
	return "accepted", true
}
