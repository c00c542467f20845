package smsstub

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/testing/nodetools"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// The facade's status callbacks are signed as Twilio signs them: Twilio's
// own Node SDK (validateRequest) takes each, over the URL the facade called
// (the adapter's StatusCallback, ?ref= included) and the form it posted,
// for a message from a number and one through a messaging service, each
// sent and then delivered or undelivered. The SDK refuses the same
// callbacks checked with another token or with a field altered, so its
// yes is not a given.
func TestTwilioCallbacksValidateWithTwilioSDK(t *testing.T) {
	t.Parallel()
	type callback struct {
		url       string
		form      url.Values
		signature string
	}
	var (
		mu   sync.Mutex
		got  []callback
		errs int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		form, perr := url.ParseQuery(string(body))
		mu.Lock()
		defer mu.Unlock()
		if err != nil || perr != nil || r.Method != http.MethodPost {
			errs++
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got = append(got, callback{"http://" + r.Host + r.URL.RequestURI(), form, r.Header.Get("X-Twilio-Signature")})
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"result":"applied"}`)
	}))
	t.Cleanup(srv.Close)

	s := newTwilioStub(t, Config{Twilio: Twilio{QueueFor: 50 * time.Millisecond},
		Receipts: Receipts{Delay: 100 * time.Millisecond, UndeliveredSuffixes: []string{"0013"}}})
	for _, c := range []*provider.Client{
		adapter(t, s, func(cfg *provider.TwilioConfig) { cfg.ReceiptsURL = srv.URL }),
		adapter(t, s, func(cfg *provider.TwilioConfig) { cfg.ReceiptsURL = srv.URL + "/"; cfg.MessagingServiceSID = "MG0123" }),
	} {
		for _, to := range []string{"+15550000001", "+15550000013"} {
			if o := c.Send(context.Background(), provider.Message{Key: uuid.NewString(), To: to, Body: testText}); o.Kind != provider.Sent {
				t.Fatalf("send: %+v", o)
			}
		}
	}
	// Per message: sent, then its fate.
	testkit.WaitFor(t, 20*time.Second, "every callback", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 8
	})
	mu.Lock()
	cbs := append([]callback(nil), got...)
	mu.Unlock()
	if errs != 0 || len(cbs) != 8 {
		t.Fatalf("%d callbacks, %d malformed; want 8 forms", len(cbs), errs)
	}
	var cases []nodetools.TwilioCase
	statuses := map[string]int{}
	for _, cb := range cbs {
		statuses[cb.form.Get("MessageStatus")]++
		altered := url.Values{}
		for k, vs := range cb.form {
			altered[k] = vs
		}
		altered.Set("MessageStatus", "read")
		cases = append(cases,
			nodetools.TwilioCase{Op: "validate", Token: testToken, URL: cb.url, Params: cb.form, Signature: cb.signature},
			nodetools.TwilioCase{Op: "validate", Token: "another-token", URL: cb.url, Params: cb.form, Signature: cb.signature},
			nodetools.TwilioCase{Op: "validate", Token: testToken, URL: cb.url, Params: altered, Signature: cb.signature})
	}
	if statuses["sent"] != 4 || statuses["delivered"] != 2 || statuses["undelivered"] != 2 {
		t.Errorf("callback statuses %v, want 4 sent, 2 delivered, 2 undelivered", statuses)
	}
	answers := nodetools.Twilio(t, cases)
	for i := 0; i < len(answers); i += 3 {
		cb := cbs[i/3]
		if q, _ := url.Parse(cb.url); q == nil || q.Query().Get("ref") == "" {
			t.Errorf("callback %d: no ?ref= in the URL called", i/3)
		}
		if !answers[i].Valid {
			t.Errorf("callback %d (%s): Twilio's SDK refused the facade's signature", i/3, cb.form.Get("MessageStatus"))
		}
		if answers[i+1].Valid || answers[i+2].Valid {
			t.Errorf("callback %d: Twilio's SDK took it with another token (%v) or an altered field (%v)", i/3, answers[i+1].Valid, answers[i+2].Valid)
		}
	}
}
