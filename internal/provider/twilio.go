package provider

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"
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
	// when set) created since the row, matched on the exact body.
	Lookup bool
	// Timeout, ConnectTimeout, PermanentCodes, MaxConns, MaxRetryAfter and
	// Transport are as in Config.
	Timeout, ConnectTimeout time.Duration
	PermanentCodes          []int
	MaxConns                int
	MaxRetryAfter           time.Duration
	Transport               http.RoundTripper
}

// NewTwilio returns a client for Twilio's Messages API:
// POST {BaseURL}/2010-04-01/Accounts/{AccountSid}/Messages.json with form
// fields To, From (or MessagingServiceSid) and Body, basic auth, and
// Twilio's error JSON {"code","message","more_info","status"}.
//
// Twilio documents that creating a message is not idempotent, so the client
// always runs in non-idempotent mode: an outcome that may have reached
// Twilio is Ambiguous (the row ends unknown), never retried.
func NewTwilio(cfg TwilioConfig) (*Client, error) {
	switch {
	case cfg.AccountSID == "":
		return nil, errors.New("provider: twilio AccountSID is required")
	case cfg.AuthToken == "":
		return nil, errors.New("provider: twilio AuthToken is required")
	case cfg.From == "" && cfg.MessagingServiceSID == "":
		return nil, errors.New("provider: twilio From or MessagingServiceSID is required")
	case strings.ContainsAny(cfg.AccountSID, "/?#"):
		return nil, errors.New("provider: twilio AccountSID is malformed")
	}
	c, err := New(Config{
		BaseURL:        cmp.Or(cfg.BaseURL, "https://api.twilio.com"),
		Timeout:        cfg.Timeout,
		ConnectTimeout: cfg.ConnectTimeout,
		Idempotent:     false,
		PermanentCodes: cfg.PermanentCodes,
		MaxConns:       cfg.MaxConns,
		MaxRetryAfter:  cfg.MaxRetryAfter,
		Transport:      cfg.Transport,
		ReceiptsURL:    cfg.ReceiptsURL,
	})
	if err != nil {
		return nil, err
	}
	c.endpoint = strings.TrimRight(c.cfg.BaseURL, "/") + "/2010-04-01/Accounts/" + url.PathEscape(cfg.AccountSID) + "/Messages.json"
	c.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(cfg.AccountSID+":"+cfg.AuthToken))
	c.refField = "sid"
	c.newRequest = func(ctx context.Context, m Message) (*http.Request, error) {
		form := url.Values{"To": {m.To}, "Body": {m.Body}}
		if cfg.ReceiptsURL != "" {
			form.Set("StatusCallback", strings.TrimRight(cfg.ReceiptsURL, "/")+"/v1/receipts/twilio?ref="+url.QueryEscape(m.Key))
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
	if cfg.Lookup {
		c.lookup = func(ctx context.Context, q LookupQuery) ([]Found, error) { return c.twilioLookup(ctx, cfg, q) }
	}
	return c, nil
}

// twilioLookup lists Twilio's messages to q.To (from cfg.From, when set)
// sent since the day of q.Since, and keeps those created since q.Since
// (less a minute for clocks) with exactly q.Body: Twilio keeps no reference
// of ours, so the message is what identifies it. At most five pages.
func (c *Client) twilioLookup(ctx context.Context, cfg TwilioConfig, q LookupQuery) ([]Found, error) {
	params := url.Values{"To": {q.To}, "PageSize": {"100"}}
	if cfg.From != "" {
		params.Set("From", cfg.From)
	}
	if !q.Since.IsZero() {
		params.Set("DateSent>", q.Since.UTC().Add(-24*time.Hour).Format("2006-01-02"))
	}
	base := strings.TrimRight(c.cfg.BaseURL, "/")
	next := "/2010-04-01/Accounts/" + url.PathEscape(cfg.AccountSID) + "/Messages.json?" + params.Encode()
	var out []Found
	for page := 0; next != "" && page < 5; page++ {
		var ans struct {
			Messages []struct {
				SID         string `json:"sid"`
				Body        string `json:"body"`
				Status      string `json:"status"`
				DateCreated string `json:"date_created"`
			} `json:"messages"`
			NextPageURI string `json:"next_page_uri"`
		}
		if !strings.HasPrefix(next, "/") {
			return nil, errors.New("lookup: next page outside the API")
		}
		if err := c.getJSON(ctx, base+next, &ans); err != nil {
			return nil, err
		}
		for _, m := range ans.Messages {
			created, err := time.Parse(time.RFC1123Z, m.DateCreated)
			if m.Body != q.Body || !plainRef(m.SID) || (err == nil && created.Before(q.Since.Add(-time.Minute))) {
				continue
			}
			out = append(out, Found{Ref: m.SID, Status: receiptStatus(m.Status)})
		}
		next = ans.NextPageURI
	}
	return out, nil
}
