package smsstub

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/provider"
)

// msgExpiring returns a request body with expires_at.
func msgExpiring(to, text, expiresAt string) string {
	b, err := json.Marshal(messageRequest{To: to, Body: text, ExpiresAt: expiresAt})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// A malformed expires_at is refused like any other invalid field: 400
// code 400, nothing delivered, the key still unused.
func TestExpiresAtValidation(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, body string
		status     int
	}{
		{"not a time", msgExpiring(testTo, testText, "tomorrow"), 400},
		{"a date alone", msgExpiring(testTo, testText, "2100-01-02"), 400},
		{"no zone", msgExpiring(testTo, testText, "2100-01-02T03:04:05"), 400},
		{"a space for T", msgExpiring(testTo, testText, "2100-01-02 03:04:05Z"), 400},
		{"a number", `{"to":"+15551234567","body":"x","expires_at":4102542245}`, 400},
		{"whole seconds", msgExpiring(testTo, testText, "2100-01-02T03:04:05Z"), 201},
		{"fractional seconds", msgExpiring(testTo, testText, "2100-01-02T03:04:05.678901Z"), 201},
		{"an offset", msgExpiring(testTo, testText, "2100-01-02T04:04:05+01:00"), 201},
		{"empty: none", msgExpiring(testTo, testText, ""), 201},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStub(t, Config{})
			r := s.send(t, "k1", tt.body)
			if tt.status == http.StatusCreated {
				providerID(t, r)
				return
			}
			if r.status != tt.status {
				t.Fatalf("status %d, want %d; body %s", r.status, tt.status, r.body)
			}
			var e errorResponse
			if err := json.Unmarshal(r.body, &e); err != nil || e.Code != 400 || e.Message == "" {
				t.Fatalf("body %q (err %v), want code 400 and a message", r.body, err)
			}
			if d := s.Deliveries()["k1"]; d.Deliveries != 0 {
				t.Fatalf("record %+v: delivered", d)
			}
			providerID(t, s.send(t, "k1", msg(testTo, testText)))
		})
	}
}

// A message whose expires_at has passed when its request arrives (by the
// stub's clock), or is that very instant, is refused: 400 CodeExpired, no
// delivery, counted; the key stays unseen, so the same key with another
// expiry is a new request, not a mismatch. One with time left is taken,
// and its delivery record shows the expiry it was given, exactly; a
// retry of it after the expiry gets the replay, not a refusal that would
// say it was never taken. With keys ignored, an expired message is
// refused too.
func TestExpiredMessageIsNotTaken(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	s := newStub(t, Config{Retention: time.Hour, Now: clock.Now})
	now := clock.Now()
	stamp := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339Nano) }

	for i, at := range []string{stamp(-time.Hour), stamp(-time.Nanosecond), stamp(0)} {
		r := s.send(t, "k1", msgExpiring(testTo, testText, at))
		wantError(t, r, http.StatusBadRequest, CodeExpired, msgExpired)
		if got := s.Stats(); got.Expired != int64(i+1) || got.Deliveries != 0 {
			t.Fatalf("expires_at %s: Stats() = %+v, want %d expired, no delivery", at, got, i+1)
		}
	}
	if d := s.Deliveries()["k1"]; d.Deliveries != 0 || d.Requests != 3 || !d.ExpiresAt.IsZero() {
		t.Fatalf("record of the refused key: %+v", d)
	}
	if at, ok := s.Taken()["k1"]; ok {
		t.Fatalf("refused key taken at %s", at)
	}

	// The same key, a nanosecond left: taken, the expiry recorded.
	body := msgExpiring(testTo, testText, stamp(time.Nanosecond))
	id := providerID(t, s.send(t, "k1", body))
	if d := s.Deliveries()["k1"]; d.Deliveries != 1 || !d.ExpiresAt.Equal(now.Add(time.Nanosecond)) || d.ProviderID != id {
		t.Fatalf("record %+v, want one delivery with its expiry", d)
	}
	if at := s.Taken()["k1"]; !at.Equal(now) {
		t.Fatalf("taken at %s, want %s", at, now)
	}
	// Its retry once the expiry has passed: the replay.
	clock.Advance(time.Minute)
	if r := s.send(t, "k1", body); !r.replayed() || providerID(t, r) != id {
		t.Fatalf("retry after the expiry: replayed=%v %s, want the replay of %s", r.replayed(), r.body, id)
	}
	if got := s.Stats(); got.Expired != 3 || got.Deliveries != 1 || got.Replays != 1 {
		t.Errorf("Stats() = %+v", got)
	}

	// Over the admin API: the expiry as given, and none without one.
	providerID(t, s.send(t, "k2", msg(testTo, testText)))
	ds, err := FetchDeliveries(context.Background(), s.url)
	if err != nil {
		t.Fatal(err)
	}
	if !ds["k1"].ExpiresAt.Equal(now.Add(time.Nanosecond)) || !ds["k2"].ExpiresAt.IsZero() {
		t.Errorf("admin deliveries: k1 %v, k2 %v", ds["k1"].ExpiresAt, ds["k2"].ExpiresAt)
	}
	raw := getRaw(t, s.url+"/admin/deliveries")
	if !strings.Contains(raw, `"expires_at":"2030-01-02T03:04:05.000000001Z"`) || strings.Count(raw, "expires_at") != 1 {
		t.Errorf("admin deliveries: %s", raw)
	}

	// Keys ignored: no cache, the expiry still checked.
	ik := newStub(t, Config{IgnoreKeys: true, Now: clock.Now})
	wantError(t, ik.send(t, "", msgExpiring(testTo, testText, stamp(0))), http.StatusBadRequest, CodeExpired, msgExpired)
	if got := ik.Stats(); got.Expired != 1 || got.Deliveries != 0 {
		t.Errorf("keys ignored: Stats() = %+v", got)
	}
}

// The sender's generic client against the stub: a message with an expiry
// is taken, and the stub's record shows the very expiry the client was
// given (expires_at, to the nanosecond). With the stub's clock ahead of the
// client's, a message the client still sends arrives expired: the stub
// refuses it, which the client classifies as expired: nothing taken, and
// nothing to try again.
func TestExpiresAtFromTheGenericClient(t *testing.T) {
	t.Parallel()
	ahead := func() time.Time { return time.Now().Add(time.Hour) }
	s := newStub(t, Config{})
	skewed := newStub(t, Config{Now: ahead})
	ctx := context.Background()
	for _, stub := range []*testStub{s, skewed} {
		c, err := provider.New(provider.Config{BaseURL: stub.url, Idempotent: true, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		m := provider.Message{Key: "k1", To: testTo, Body: testText,
			ExpiresAt: time.Now().Add(time.Minute).In(time.FixedZone("CET", 3600))}
		o := c.Send(ctx, m)
		d := stub.Deliveries()["k1"]
		switch stub {
		case s:
			if o.Kind != provider.Sent || d.Deliveries != 1 || !d.ExpiresAt.Equal(m.ExpiresAt) {
				t.Errorf("outcome %+v, record %+v; want Sent, the expiry recorded as sent", o, d)
			}
		case skewed:
			if o.Kind != provider.Expired || o.HTTPStatus != 400 || o.Code != CodeExpired || o.MaybeAccepted || d.Deliveries != 0 {
				t.Errorf("the stub an hour ahead: outcome %+v, record %+v; want expired, a 400 %d, nothing taken", o, d, CodeExpired)
			}
		}
	}
}

// The Twilio facade reads ValidityPeriod as Twilio's document bounds it:
// an integer from 1 to 36000 is taken and kept in the delivery's record;
// anything else is refused, 400 code 20001, nothing delivered. The
// sender's Twilio adapter, given a message with an hour left, sends a
// period the facade takes: just under 3600 seconds, never more.
func TestTwilioFacadeValidityPeriod(t *testing.T) {
	t.Parallel()
	s := newTwilioStub(t, Config{})
	create := func(key string, validity ...string) (int, twilioError) {
		t.Helper()
		form := url.Values{"To": {testTo}, "From": {testFrom}, "Body": {testText},
			"StatusCallback": {"http://127.0.0.1:1/v1/receipts/twilio?ref=" + key}}
		if len(validity) > 0 {
			form["ValidityPeriod"] = validity
		}
		req, _ := http.NewRequest(http.MethodPost, s.url+listPath, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth(testAccount, testToken)
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e twilioError
		if resp.StatusCode != http.StatusCreated {
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, e
	}
	for _, tt := range []struct {
		name     string
		validity []string
		status   int
		recorded int
	}{
		{"none", nil, 201, 0},
		{"the minimum", []string{"1"}, 201, 1},
		{"an hour", []string{"3600"}, 201, 3600},
		{"the maximum", []string{"36000"}, 201, 36000},
		{"zero", []string{"0"}, 400, 0},
		{"over the maximum", []string{"36001"}, 400, 0},
		{"negative", []string{"-5"}, 400, 0},
		{"not an integer", []string{"1.5"}, 400, 0},
		{"not a number", []string{"soon"}, 400, 0},
		{"empty", []string{""}, 400, 0},
	} {
		key := "vp-" + strings.ReplaceAll(tt.name, " ", "-")
		status, e := create(key, tt.validity...)
		d := s.Deliveries()[key]
		switch {
		case status != tt.status:
			t.Errorf("%s: status %d, want %d", tt.name, status, tt.status)
		case status == 400 && (e.Code != CodeTwilioInvalid || !strings.Contains(e.Message, "ValidityPeriod") || d.Deliveries != 0):
			t.Errorf("%s: %+v, record %+v; want code %d naming ValidityPeriod, nothing delivered", tt.name, e, d, CodeTwilioInvalid)
		case status == 201 && (d.Deliveries != 1 || d.ValidityPeriod != tt.recorded):
			t.Errorf("%s: record %+v, want one delivery with ValidityPeriod %d", tt.name, d, tt.recorded)
		}
	}
	raw := getRaw(t, s.url+"/admin/deliveries")
	if !strings.Contains(raw, `"validity_period":3600`) || strings.Count(raw, "validity_period") != 3 {
		t.Errorf("admin deliveries: %s", raw)
	}

	// The adapter, an hour left.
	m := provider.Message{Key: uuid.NewString(), To: testTo, Body: testText, ExpiresAt: time.Now().Add(time.Hour)}
	if o := adapter(t, s, nil).Send(context.Background(), m); o.Kind != provider.Sent {
		t.Fatalf("adapter: %+v", o)
	}
	if d := s.Deliveries()[m.Key]; d.Deliveries != 1 || d.ValidityPeriod < 3590 || d.ValidityPeriod > 3599 {
		t.Errorf("adapter, an hour left: record %+v, want ValidityPeriod just under 3600", d)
	}
}
