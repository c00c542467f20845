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
	})
	if err != nil {
		return nil, err
	}
	c.endpoint = strings.TrimRight(c.cfg.BaseURL, "/") + "/2010-04-01/Accounts/" + url.PathEscape(cfg.AccountSID) + "/Messages.json"
	c.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(cfg.AccountSID+":"+cfg.AuthToken))
	c.refField = "sid"
	c.newRequest = func(ctx context.Context, m Message) (*http.Request, error) {
		form := url.Values{"To": {m.To}, "Body": {m.Body}}
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
	return c, nil
}
