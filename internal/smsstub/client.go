package smsstub

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// The helpers below drive a stub's admin API over HTTP, for tests and the
// demo that run the stub as a separate process. baseURL is the stub's root,
// such as "http://127.0.0.1:9090", with or without a trailing slash. They use
// http.DefaultClient; ctx bounds each call.

// FetchDeliveries returns the stub's per-key delivery records
// (GET /admin/deliveries).
func FetchDeliveries(ctx context.Context, baseURL string) (map[string]Delivery, error) {
	var out map[string]Delivery
	if err := adminCall(ctx, http.MethodGet, baseURL, "/admin/deliveries", nil, http.StatusOK, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// FetchTaken returns when the request of each key's last delivery arrived
// (GET /admin/taken; Server.Taken).
func FetchTaken(ctx context.Context, baseURL string) (map[string]time.Time, error) {
	var out map[string]time.Time
	if err := adminCall(ctx, http.MethodGet, baseURL, "/admin/taken", nil, http.StatusOK, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// FetchStats returns the stub's counters (GET /admin/stats).
func FetchStats(ctx context.Context, baseURL string) (Stats, error) {
	var out Stats
	if err := adminCall(ctx, http.MethodGet, baseURL, "/admin/stats", nil, http.StatusOK, &out); err != nil {
		return Stats{}, err
	}
	return out, nil
}

// PostFaults replaces the stub's faults (POST /admin/faults) and returns the
// faults now in force, with defaults applied.
func PostFaults(ctx context.Context, baseURL string, f Faults) (Faults, error) {
	body, err := json.Marshal(f)
	if err != nil {
		return Faults{}, fmt.Errorf("smsstub: encode faults: %w", err)
	}
	var out Faults
	if err := adminCall(ctx, http.MethodPost, baseURL, "/admin/faults", body, http.StatusOK, &out); err != nil {
		return Faults{}, err
	}
	return out, nil
}

// PostInbound has the stub forward a recipient's reply to the receiver,
// signed (POST /admin/inbound), and returns the status the receiver
// answered.
func PostInbound(ctx context.Context, baseURL string, in Inbound) (int, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return 0, fmt.Errorf("smsstub: encode inbound: %w", err)
	}
	var out struct {
		Status int `json:"status"`
	}
	if err := adminCall(ctx, http.MethodPost, baseURL, "/admin/inbound", body, http.StatusOK, &out); err != nil {
		return 0, err
	}
	return out.Status, nil
}

// PostReset clears the stub's deliveries, stored responses and counters
// (POST /admin/reset).
func PostReset(ctx context.Context, baseURL string) error {
	return adminCall(ctx, http.MethodPost, baseURL, "/admin/reset", nil, http.StatusNoContent, nil)
}

// adminCall performs one admin request, checks its status and decodes the
// JSON answer into out unless out is nil.
func adminCall(ctx context.Context, method, baseURL, path string, body []byte, want int, out any) error {
	url := strings.TrimSuffix(baseURL, "/") + path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return fmt.Errorf("smsstub: %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("smsstub: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body) // the stub is trusted; deliveries can be large
	if err != nil {
		return fmt.Errorf("smsstub: %s %s: read response: %w", method, path, err)
	}
	if resp.StatusCode != want {
		return fmt.Errorf("smsstub: %s %s: status %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(truncate(raw, 512)))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("smsstub: %s %s: decode response: %w", method, path, err)
	}
	return nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
