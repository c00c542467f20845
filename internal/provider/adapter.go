package provider

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// adapter is what sets one provider's adapter apart when its Client is
// built: every adapter checks its own Config the same way, reaches its API
// at a default base URL unless told otherwise, and POSTs its messages
// under it. What an adapter's Config shares with Config (the timeouts, the
// codes, the pool, the transport, the receipts URL) goes to New unchanged.
type adapter struct {
	// name is the provider's, as the errors of its Config name it:
	// "provider: twilio AccountSID is required".
	name string
	// base is the API's base URL when the Config gives none; path is where
	// messages are POSTed under the base URL.
	base, path string
}

// rule is one check of an adapter's Config: when bad, the adapter refuses
// the Config with err.
type rule struct {
	bad bool
	err error
}

// required is the rule that one of values, the settings field names, is
// set ("From or MessagingServiceSID" when either will do).
func (a adapter) required(field string, values ...string) rule {
	bad := true
	for _, v := range values {
		if v != "" {
			bad = false
		}
	}
	return rule{bad, fmt.Errorf("provider: %s %s is required", a.name, field)}
}

// invalid is the rule that what, a sentence about a setting, is not the
// case: "AccountSID is malformed".
func (a adapter) invalid(bad bool, what string) rule {
	return rule{bad, fmt.Errorf("provider: %s %s", a.name, what)}
}

// pageSize and pages are the rules of a lookup that reads the provider's
// list page by page: LookupPageSize (size) from 1 to maxSize and
// LookupPages (pages) not negative, zero taking the adapter's default.
func (a adapter) pageSize(size, maxSize int) rule {
	return a.invalid(size < 0 || size > maxSize, fmt.Sprintf("LookupPageSize must be 1 to %d", maxSize))
}

func (a adapter) pages(pages int) rule {
	return a.invalid(pages < 0, "LookupPages must be positive")
}

// newClient checks rules in order and refuses cfg with the first broken
// one's error, so that the error is the same whichever others are broken
// too; then it builds the Client as New does, at a.base when cfg has no
// BaseURL, POSTing to a.path under it, with the provider's opt-out codes
// (optout.go). A provider's own API honours no key
// of ours and documents no 503 as taking nothing: only a request that never
// had a connection, or a status the adapter lists as refused, is certainly
// not taken there.
func (a adapter) newClient(cfg Config, rules ...rule) (*Client, error) {
	for _, r := range rules {
		if r.bad {
			return nil, r.err
		}
	}
	cfg.BaseURL, cfg.Idempotent = cmp.Or(cfg.BaseURL, a.base), false
	c, err := New(cfg)
	if err != nil {
		return nil, err
	}
	// The generic API's expiry code is its contract's alone: another
	// provider's 4xx with the same number is that provider's refusal,
	// which took nothing but was a call, not an expiry the client kept.
	c.unavailableTakesNothing, c.expiredCode = false, 0
	c.endpoint = strings.TrimRight(c.cfg.BaseURL, "/") + a.path
	c.optOut = optOutCodes[a.name]
	return c, nil
}

// basicAuth is the Authorization header of HTTP basic authentication.
func basicAuth(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

// receiptsAt is where a provider is asked to send its receipts: path under
// the receiver's public URL base, however many slashes base ends with.
func receiptsAt(base, path string) string {
	return strings.TrimRight(base, "/") + path
}

// postJSON builds the POST of v, as JSON, to the client's endpoint: every
// send of a JSON API (the generic API's adds its Idempotency-Key).
func (c *Client) postJSON(ctx context.Context, v any) (*http.Request, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	return req, nil
}

// e164Digits are the digits of an E.164 number, without its '+': 7 to 15,
// the first not 0, as every adapter's API takes a number (with or without
// the '+'). The error never holds the number.
func e164Digits(e164 string) (string, error) {
	d := strings.TrimPrefix(e164, "+")
	if len(d) < 7 || len(d) > 15 || strings.HasPrefix(d, "0") {
		return "", errors.New("the number is not E.164 of 7 to 15 digits")
	}
	for i := 0; i < len(d); i++ {
		if d[i] < '0' || d[i] > '9' {
			return "", errors.New("the number is not E.164 digits")
		}
	}
	return d, nil
}

// errorCode reads a provider's numeric error code from its text: a
// positive integer that fits the attempts log's int32 column, else 0 (no
// code, a word, a number out of range).
func errorCode(s string) int {
	n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(s), `"`))
	if err != nil || n <= 0 || n >= 1<<31 {
		return 0
	}
	return n
}

// errorText joins an error answer's two parts (a title and its detail, a
// code word and its text) as "head: tail", either alone when the other is
// empty.
func errorText(head, tail string) string {
	head, tail = strings.TrimSpace(head), strings.TrimSpace(tail)
	switch {
	case head == "":
		return tail
	case tail == "":
		return head
	}
	return head + ": " + tail
}
