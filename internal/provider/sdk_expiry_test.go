package provider_test

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/testing/nodetools"
)

// captured is a request a test server received: its path and body.
type captured struct {
	path string
	body []byte
}

// startCapture is a server that keeps every request and answers each as
// Twilio and Sinch answer a send (201, a sid, a batch id).
func startCapture(t *testing.T) (base string, seen func() []captured) {
	t.Helper()
	var (
		mu  sync.Mutex
		got []captured
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, captured{r.URL.Path, body})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"sid":"SM00000000000000000000000000000000","id":"01FC66621VHDBN119Z8PMV1QPQ"}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []captured {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// The providers' official SDKs send the expiry parameters as the adapters
// do: Twilio's Node SDK (messages.create's validityPeriod) sends the form
// field ValidityPeriod, an integer, beside the same To, From and Body as
// the adapter; Sinch's (@sinch/sdk-core, batches.send's expire_at, a Date)
// sends expire_at as the very string the adapter sends for the same
// expiry: UTC, to the millisecond.
func TestExpiryParametersAreTheSDKs(t *testing.T) {
	t.Parallel()
	base, seen := startCapture(t)
	// A whole second: the SDK writes its milliseconds all the same.
	expiry := time.Now().Add(time.Hour).Truncate(time.Second)
	in := map[string]any{
		"base": base,
		"twilio": map[string]any{"account_sid": twilioAccount, "auth_token": "tok", "to": testMsg.To,
			"from": "+15550001111", "body": testMsg.Body, "validity_period": 3599},
		"sinch": map[string]any{"service_plan_id": "plan", "api_token": "tok", "to": testMsg.To,
			"from": "Acme", "body": testMsg.Body, "expire_at": expiry.UTC().Format(time.RFC3339Nano)},
	}
	stdin, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	nodetools.Node(t, "sdk-expiry.js", stdin, nil)

	tw, err := provider.NewTwilio(provider.TwilioConfig{BaseURL: base, AccountSID: twilioAccount, AuthToken: "tok",
		From: "+15550001111", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := provider.NewSinch(provider.SinchConfig{BaseURL: base, ServicePlanID: "plan", APIToken: "tok",
		From: "Acme", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := testMsg
	m.ExpiresAt = expiry
	for _, c := range []*provider.Client{tw, sc} {
		if o := c.Send(context.Background(), m); o.Kind != provider.Sent {
			t.Fatalf("adapter: %+v", o)
		}
	}

	got := seen()
	if len(got) != 4 {
		t.Fatalf("the server got %d requests, want 4 (two by the SDKs, two by the adapters)", len(got))
	}
	// Twilio: the SDK's form and the adapter's.
	messages := strings.Replace(twilioMessages, "{AccountSid}", twilioAccount, 1)
	sdkForm, adapterForm := parseForm(t, got[0], messages), parseForm(t, got[2], messages)
	if k1, k2 := slices.Sorted(maps.Keys(sdkForm)), slices.Sorted(maps.Keys(adapterForm)); !slices.Equal(k1, k2) || !slices.Contains(k1, "ValidityPeriod") {
		t.Errorf("Twilio's SDK sends the fields %v, the adapter %v", k1, k2)
	}
	if v := sdkForm.Get("ValidityPeriod"); v != "3599" {
		t.Errorf("Twilio's SDK sends ValidityPeriod %q, want 3599", v)
	}
	if v, err := strconv.Atoi(adapterForm.Get("ValidityPeriod")); err != nil || v < 3590 || v > 3599 {
		t.Errorf("the adapter sends ValidityPeriod %q for an hour left", adapterForm.Get("ValidityPeriod"))
	}
	// Sinch: the SDK's expire_at and the adapter's.
	sdkAt, adapterAt := expireAt(t, got[1]), expireAt(t, got[3])
	if sdkAt == "" || sdkAt != adapterAt {
		t.Errorf("Sinch's SDK sends expire_at %q, the adapter %q, for the same expiry", sdkAt, adapterAt)
	}
}

// parseForm is the form of c, a create of Twilio's Messages resource.
func parseForm(t *testing.T, c captured, path string) url.Values {
	t.Helper()
	if c.path != path {
		t.Fatalf("a request to %s, want Twilio's %s", c.path, path)
	}
	form, err := url.ParseQuery(string(c.body))
	if err != nil {
		t.Fatal(err)
	}
	return form
}

// expireAt is the expire_at of c, a Sinch batch.
func expireAt(t *testing.T, c captured) string {
	t.Helper()
	if c.path != "/xms/v1/plan/batches" {
		t.Fatalf("a request to %s, want Sinch's batches", c.path)
	}
	var b struct {
		ExpireAt string `json:"expire_at"`
	}
	if err := json.Unmarshal(c.body, &b); err != nil {
		t.Fatal(err)
	}
	return b.ExpireAt
}
