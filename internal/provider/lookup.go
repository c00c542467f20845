package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// LookupQuery asks a provider which messages it has for one outbox row.
type LookupQuery struct {
	// Reference is the row id the messages were sent with.
	Reference string
	// To and Body identify the message where the provider keeps no
	// reference (Twilio, LookupByContent): its messages to To with the same
	// text (safetext.SameText), created since Since less LookupMargin.
	To, Body string
	Since    time.Time
}

// LookupMargin is how long before LookupQuery.Since a message found by its
// content may have been created and still count: the provider's clock and
// the database's may disagree by that much.
const LookupMargin = time.Minute

// Found is one message a provider has for a reference.
type Found struct {
	// Ref is the provider's id for it.
	Ref string
	// Status is what the provider knows of it: "delivered", "undelivered"
	// or "accepted" (taken, not yet reported delivered).
	Status string
	// Created is when the provider created it, by the provider's clock;
	// zero when the provider does not say (the generic API).
	Created time.Time
}

// LookupResult is a lookup's answer.
type LookupResult struct {
	// Found are the provider's messages for the reference: none means the
	// provider never accepted one (given time to show it), one settles the
	// attempt, several mean it was sent more than once already.
	Found []Found
	// Err is set when the lookup itself failed; its text is fit for logs
	// (no number, no body, no credential).
	Err error
	// Latency is the lookup's wall time.
	Latency time.Duration
}

// CanLookup reports whether the client can look messages up.
func (c *Client) CanLookup() bool { return c.lookup != nil }

// LookupByContent reports whether Lookup finds messages by their number and
// text rather than by our reference (Twilio keeps none of ours): a message
// it finds may then be another row's, one with the same text to the same
// number (outbox.Twins finds those rows).
func (c *Client) LookupByContent() bool { return c.byContent }

// Lookup asks the provider which messages it has for q. It never panics on
// a provider's answer. Each request of it (a page of a list) is bounded by
// the client's timeout; the whole by ctx (the sender's claim lease), and by
// the pages a lookup may read.
func (c *Client) Lookup(ctx context.Context, q LookupQuery) LookupResult {
	start := time.Now()
	if c.lookup == nil {
		return LookupResult{Err: ErrNoLookup, Latency: time.Since(start)}
	}
	found, err := c.lookup(ctx, q)
	return LookupResult{Found: found, Err: err, Latency: time.Since(start)}
}

// getJSON GETs u with the client's credentials and decodes a 200 answer of
// at most limit bytes into v.
func (c *Client) getJSON(ctx context.Context, u string, limit int, v any) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return errors.New("build lookup request")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "sendonce")
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("lookup: %s", describe(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	switch {
	case err != nil:
		return fmt.Errorf("lookup: %s", describe(err))
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("lookup: http %d", resp.StatusCode)
	case len(data) > limit:
		return errors.New("lookup: answer too large")
	}
	if err := json.Unmarshal(data, v); err != nil {
		return errors.New("lookup: answer is not the expected JSON")
	}
	return nil
}

// genericLookup is GET BaseURL/v1/messages?reference=<row id>, answered
// {"messages":[{"id":"msg_...","reference":"...","status":"..."}]}.
func (c *Client) genericLookup(ctx context.Context, q LookupQuery) ([]Found, error) {
	var ans struct {
		Messages []struct {
			ID        string `json:"id"`
			Reference string `json:"reference"`
			Status    string `json:"status"`
		} `json:"messages"`
	}
	u := c.endpoint + "?reference=" + url.QueryEscape(q.Reference)
	if err := c.getJSON(ctx, u, MaxResponseBytes, &ans); err != nil {
		return nil, err
	}
	var out []Found
	for _, m := range ans.Messages {
		if m.Reference != q.Reference || !plainRef(m.ID) {
			continue // not ours, or not a usable id
		}
		out = append(out, Found{Ref: m.ID, Status: receiptStatus(m.Status)})
	}
	return out, nil
}

// receiptStatus maps the generic API's message status to what sendonce
// records: delivered, undelivered, or accepted (anything else it says it
// has). Twilio's statuses are twilioStatus's.
func receiptStatus(s string) string {
	switch strings.ToLower(s) {
	case "delivered", "read":
		return "delivered"
	case "undelivered", "failed":
		return "undelivered"
	}
	return "accepted"
}
