package provider

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// SinchConfig configures the Sinch adapter (the SMS REST API, "XMS" v1).
type SinchConfig struct {
	// BaseURL is the API's regional base URL; default
	// https://us.sms.api.sinch.com (the document's server). Batches are
	// POSTed to BaseURL/xms/v1/{ServicePlanID}/batches.
	BaseURL string
	// ServicePlanID and APIToken are the credentials (the token is sent as
	// a Bearer token); required.
	ServicePlanID, APIToken string
	// From is the sender: a number (E.164), a short code or an
	// alphanumeric sender id; required.
	From string
	// ReceiptsURL, when set, asks Sinch for a delivery report per
	// recipient (delivery_report "per_recipient") at
	// ReceiptsURL/v1/receipts/sinch (callback_url). Empty asks for none
	// (the service plan's own callback URL, if any, is Sinch's business).
	ReceiptsURL string
	// Lookup enables Lookup: every page of the service plan's batches from
	// From created since the row (ListBatches), those whose
	// client_reference is the row id.
	Lookup bool
	// LookupPageSize is the batches asked for per page (page_size), 1 to
	// 100; default 100. LookupPages caps the pages one lookup reads; more
	// is ErrLookupIncomplete, never an answer. Default
	// DefaultSinchLookupPages.
	LookupPageSize, LookupPages int
	// Timeout, ConnectTimeout, PermanentCodes, MaxConns, MaxRetryAfter and
	// Transport are as in Config.
	Timeout, ConnectTimeout time.Duration
	PermanentCodes          []int
	MaxConns                int
	MaxRetryAfter           time.Duration
	Transport               http.RoundTripper
}

// Sinch's lookup: its list keeps batches for 14 days ("batch messages
// created in the last 14 days", ListBatches), and a page holds at most 100.
const (
	// SinchListRetention is how long Sinch's batch list shows a batch.
	SinchListRetention = 14 * 24 * time.Hour
	// DefaultSinchLookupPages is SinchConfig.LookupPages's default: with
	// pages of 100, a sender with up to 1,000 batches since the row.
	DefaultSinchLookupPages = 10
	// maxSinchBatchBytes bounds one batch of a page: 1,600 characters of
	// body each escaped as a surrogate pair (12 bytes), and 1 KiB of other
	// fields.
	maxSinchBatchBytes = 20 << 10
)

// SinchReceiptsPath is where the Sinch adapter asks for delivery reports,
// under the receiver's public URL.
const SinchReceiptsPath = "/v1/receipts/sinch"

// NewSinch returns a client for Sinch's SMS REST API:
// POST {BaseURL}/xms/v1/{service_plan_id}/batches with the JSON body
//
//	{"to":["+447700900000"],"from":"...","body":"...","client_reference":"<row id>",
//	 "delivery_report":"per_recipient","callback_url":"..."}
//
// and "Authorization: Bearer <token>", answered 201 with the batch
// ({"id":"01FC66621VHDBN119Z8PMV1QPQ",...}) or an error
// {"code":"syntax_invalid_parameter_format","text":"..."}. The shape is
// that of Sinch's published OpenAPI document of the API (SendSMS, schema
// sendBatchObject; internal/provider/testdata/sinch has it, and a
// conformance test checks every request against it).
//
// A message with an expiry carries expire_at (sinchExpireAt): when Sinch
// stops trying to deliver it.
//
// Sinch documents no idempotency key for a batch, so the client always
// runs in non-idempotent mode: an attempt that may have reached Sinch and
// lost its answer is Ambiguous, never retried blindly. client_reference
// carries the row id, which the batch list and the delivery reports give
// back: a lookup (Lookup) settles the attempt, and a receipt finds its row
// even when the answer was lost.
//
// Answers are classified by the statuses the document gives the send
// (SendSMS's responses) and Client's rules for the rest:
//   - 201: Sent, the batch id the Ref.
//   - 400 (the request is malformed: syntax_invalid_json,
//     syntax_invalid_parameter_format, syntax_constraint_violation) and 403
//     (forbidden: missing_callback_url and the like): Permanent; the same
//     request gets the same answer. So are 401 (the token) and 404.
//   - 429 (rate limited): Retry, after Retry-After when given; nothing was
//     sent.
//   - every 5xx, and 408, 409 and 425: Ambiguous (Sinch may have created
//     the batch before failing), as for any provider without idempotency.
//
// Sinch's error codes are words, not numbers: an Outcome's Code is 0, and
// its Reason is "<code>: <text>"; SMS_PERMANENT_CODES cannot name them.
func NewSinch(cfg SinchConfig) (*Client, error) {
	a := adapter{name: "sinch", base: "https://us.sms.api.sinch.com", path: "/xms/v1/" + url.PathEscape(cfg.ServicePlanID) + "/batches"}
	c, err := a.newClient(Config{BaseURL: cfg.BaseURL, ReceiptsURL: cfg.ReceiptsURL, Timeout: cfg.Timeout, ConnectTimeout: cfg.ConnectTimeout,
		PermanentCodes: cfg.PermanentCodes, MaxConns: cfg.MaxConns, MaxRetryAfter: cfg.MaxRetryAfter, Transport: cfg.Transport},
		a.required("ServicePlanID", cfg.ServicePlanID),
		a.required("APIToken", cfg.APIToken),
		a.required("From", cfg.From),
		a.invalid(strings.ContainsAny(cfg.ServicePlanID, "/?#%"), "ServicePlanID is malformed"),
		a.pageSize(cfg.LookupPageSize, 100),
		a.pages(cfg.LookupPages))
	if err != nil {
		return nil, err
	}
	cfg.LookupPageSize = cmp.Or(cfg.LookupPageSize, 100)
	cfg.LookupPages = cmp.Or(cfg.LookupPages, DefaultSinchLookupPages)
	c.auth = "Bearer " + cfg.APIToken
	c.refField = "id"
	c.errorFields = sinchErrorFields
	c.newRequest = func(ctx context.Context, m Message, now time.Time) (*http.Request, error) {
		to, err := e164Digits(m.To)
		if err != nil {
			return nil, err
		}
		req := struct {
			To              []string `json:"to"`
			From            string   `json:"from"`
			Body            string   `json:"body"`
			ClientReference string   `json:"client_reference"`
			DeliveryReport  string   `json:"delivery_report,omitempty"`
			CallbackURL     string   `json:"callback_url,omitempty"`
			ExpireAt        string   `json:"expire_at,omitempty"`
		}{To: []string{"+" + to}, From: cfg.From, Body: m.Body, ClientReference: m.Key}
		if !m.ExpiresAt.IsZero() {
			req.ExpireAt = sinchExpireAt(m.ExpiresAt, now)
		}
		if cfg.ReceiptsURL != "" {
			req.DeliveryReport = "per_recipient"
			req.CallbackURL = receiptsAt(cfg.ReceiptsURL, SinchReceiptsPath)
		}
		return c.postJSON(ctx, req)
	}
	if cfg.Lookup {
		c.lookup = func(ctx context.Context, q LookupQuery) ([]Found, error) { return c.sinchLookup(ctx, cfg, q) }
	}
	return c, nil
}

// The bounds of a batch's expire_at, relative to its send_at, which the
// adapter does not set (so it is when Sinch takes the batch). The
// document says of expire_at "Must be after send_at. Default is 3 days
// after send_at."; Sinch's SDK (@sinch/sms, TextRequest.expire_at) says
// "Default and max is 3 days after `send_at`". The minimum is the
// adapter's: "after" with a second to spare for the request's journey.
const (
	sinchMinExpiry = time.Second
	sinchMaxExpiry = 3 * 24 * time.Hour
)

// sinchExpireAt is the expire_at that tells Sinch a message expires at
// expires, for a request built at now: the expiry itself, in UTC to the
// millisecond, rounded down (the format Sinch's SDK writes,
// "YYYY-MM-DDThh:mm:ss.SSSZ"), so Sinch is never given more time than is
// left; at least sinchMinExpiry after now, so that a message with less
// than a second left still goes (as at Twilio), with an expire_at after
// its send_at; at most sinchMaxExpiry after now, the maximum and the
// default, so a message with more than three days left gets what it
// would get without the field.
func sinchExpireAt(expires, now time.Time) string {
	t := expires
	if lo := now.Add(sinchMinExpiry); t.Before(lo) {
		t = lo
	}
	if hi := now.Add(sinchMaxExpiry); t.After(hi) {
		t = hi
	}
	return t.UTC().Truncate(time.Millisecond).Format("2006-01-02T15:04:05.000Z07:00")
}

// sinchErrorFields reads Sinch's error answer (the document's
// errorResponseObj): {"code":"syntax_invalid_parameter_format","text":"..."}.
// The code is a word, so the numeric code is 0; the text names it.
func sinchErrorFields(data []byte) (int, string, bool) {
	var e struct {
		Code string `json:"code"`
		Text string `json:"text"`
	}
	if json.Unmarshal(data, &e) != nil {
		return 0, "", false
	}
	return 0, errorText(e.Code, e.Text), true
}

// sinchPage is one page of ListBatches, as the lookup reads it.
type sinchPage struct {
	Page     *int `json:"page"`
	Count    *int `json:"count"`
	PageSize *int `json:"page_size"`
	Batches  []struct {
		ID              string `json:"id"`
		ClientReference string `json:"client_reference"`
		CreatedAt       string `json:"created_at"`
		Canceled        bool   `json:"canceled"`
	} `json:"batches"`
}

// sinchLookup reads ListBatches, GET BaseURL/xms/v1/{plan}/batches with
// from (cfg.From) and start_date (the row's first attempt, less
// LookupMargin), page by page, and returns the batches whose
// client_reference is q.Reference. The list has no filter by reference, so
// every page is read: until the batches read reach the list's count, up to
// cfg.LookupPages; a list longer than that, a page that ends it early, or
// a batch of ours without a usable id is ErrLookupIncomplete. A batch
// created while the lookup pages may shift the pages and be read twice
// (kept once); ours, created before the lookup, cannot be skipped by it,
// whichever end of the list new batches join.
func (c *Client) sinchLookup(ctx context.Context, cfg SinchConfig, q LookupQuery) ([]Found, error) {
	params := url.Values{"from": {cfg.From}, "page_size": {strconv.Itoa(cfg.LookupPageSize)}}
	if !q.Since.IsZero() {
		params.Set("start_date", q.Since.Add(-LookupMargin).UTC().Format(time.RFC3339))
	}
	var (
		out  []Found
		seen = map[string]bool{}
		read int
	)
	limit := cfg.LookupPageSize*maxSinchBatchBytes + 64<<10
	for page := 0; ; page++ {
		if page == cfg.LookupPages {
			return nil, fmt.Errorf("%w: the sender has more than %d pages of %d batches", ErrLookupIncomplete, page, cfg.LookupPageSize)
		}
		params.Set("page", strconv.Itoa(page))
		var ans sinchPage
		if err := c.getJSON(ctx, c.endpoint+"?"+params.Encode(), limit, &ans); err != nil {
			return nil, err
		}
		if ans.Count == nil || *ans.Count < 0 {
			return nil, fmt.Errorf("%w: a page of the batch list without its count", ErrLookupIncomplete)
		}
		for _, b := range ans.Batches {
			if b.ClientReference != q.Reference {
				continue
			}
			if !plainRef(b.ID) {
				return nil, fmt.Errorf("%w: a batch of ours without a usable id", ErrLookupIncomplete)
			}
			if seen[b.ID] {
				continue
			}
			seen[b.ID] = true
			f := Found{Ref: b.ID, Status: "accepted"}
			if b.Canceled {
				// Canceled before it was sent: the phone has nothing.
				f.Status = "undelivered"
			}
			if t, err := time.Parse(time.RFC3339Nano, b.CreatedAt); err == nil {
				f.Created = t
			}
			out = append(out, f)
		}
		read += len(ans.Batches)
		switch {
		case read >= *ans.Count:
			return out, nil
		case len(ans.Batches) == 0:
			return nil, fmt.Errorf("%w: the batch list ended before its count", ErrLookupIncomplete)
		}
	}
}
