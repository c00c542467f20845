package smsstub

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// The stub forwards a recipient's reply to the receiver, signed as each of
// its APIs signs inbound messages (the generic API's JSON with the
// receipts' secret, Twilio's form with the auth token over the URL): the
// receiver takes both, and a STOP through the Twilio facade also blocks
// the number there and at the generic API, as Twilio's keyword handling
// does (400 code 21610, which the adapters classify as opted out), until a
// START. A message to a number the stub was told to refuse (OptOut) gets
// the same answer.
func TestInboundMessagesAndOptOuts(t *testing.T) {
	t.Parallel()
	admin, dsn := pgtest.NewPool(t)
	pool, err := pgxpool.New(context.Background(), pgtest.AsRole(t, dsn, "sendonce_receiver"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	secret := []byte("stub-inbound-secret-0123456789ab")
	srv := httptest.NewUnstartedServer(nil)
	public := "http://" + srv.Listener.Addr().String()
	rv, err := receiver.New(receiver.Config{Pool: pool, Secrets: [][]byte{secret}, TwilioToken: testToken, PublicURL: public,
		DefaultProvider: "none", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = rv.Handler()
	srv.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rv.Run(ctx) }()
	t.Cleanup(func() { srv.Close(); cancel(); <-done })

	s := newTwilioStub(t, Config{Receipts: Receipts{Secret: secret}})
	twilio := adapter(t, s, nil)
	generic, err := provider.New(provider.Config{BaseURL: s.url, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	listed := func(number string) string {
		t.Helper()
		var src string
		_ = admin.QueryRow(context.Background(), `SELECT source || '/' || provider || '/' || reason FROM sms_suppressions WHERE number = $1`, number).Scan(&src)
		return src
	}
	send := func(c *provider.Client, to string) provider.Outcome {
		return c.Send(context.Background(), provider.Message{Key: uuid.NewString(), To: to, Body: testText})
	}

	const a, b = "+15550001001", "+15550001002"
	for _, in := range []Inbound{
		{URL: public + "/v1/inbound/twilio", Shape: "twilio", From: a, To: testFrom, Text: "STOP"},
		{URL: public + "/v1/inbound/generic", Shape: "generic", From: b, To: testFrom, Text: " quit "},
	} {
		if code, err := s.SendInbound(context.Background(), in); err != nil || code != 200 {
			t.Fatalf("%s inbound: %d, %v", in.Shape, code, err)
		}
	}
	if got := listed(a); got != "inbound/twilio/STOP" {
		t.Errorf("the Twilio STOP's number is listed as %q", got)
	}
	if got := listed(b); got != "inbound/generic/QUIT" {
		t.Errorf("the generic QUIT's number is listed as %q", got)
	}
	for name, c := range map[string]*provider.Client{"twilio": twilio, "generic": generic} {
		if o := send(c, a); o.Kind != provider.Permanent || !o.OptedOut || o.Code != CodeOptedOut {
			t.Errorf("%s, to the number that sent STOP through the facade: %+v, want opted out", name, o)
		}
		if o := send(c, b); o.Kind != provider.Sent {
			t.Errorf("%s, to the number that sent QUIT through the generic API: %+v, want sent (only Twilio's shape blocks)", name, o)
		}
	}
	if code, err := s.SendInbound(context.Background(), Inbound{URL: public + "/v1/inbound/twilio", Shape: "twilio", From: a, To: testFrom, Text: "start"}); err != nil || code != 200 {
		t.Fatalf("START: %d, %v", code, err)
	}
	if got := listed(a); got != "" {
		t.Errorf("after START the number is still listed (%q)", got)
	}
	if o := send(twilio, a); o.Kind != provider.Sent {
		t.Errorf("after START: %+v, want sent", o)
	}
	s.OptOut(b)
	if o := send(generic, b); !o.OptedOut {
		t.Errorf("after OptOut: %+v, want opted out", o)
	}
	if n := s.Stats().OptedOut; n != 3 {
		t.Errorf("Stats.OptedOut = %d, want 3", n)
	}

	// The admin endpoint sends one as the demo does.
	body, _ := json.Marshal(Inbound{URL: public + "/v1/inbound/generic", Shape: "generic", From: "+15550001003", To: testFrom, Text: "HELP"})
	res, err := http.Post(s.url+"/admin/inbound", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var ans struct{ Status int }
	_ = json.NewDecoder(res.Body).Decode(&ans)
	res.Body.Close()
	if res.StatusCode != 200 || ans.Status != 200 || listed("+15550001003") != "" {
		t.Errorf("POST /admin/inbound: %d, the receiver answered %d; a HELP lists nothing", res.StatusCode, ans.Status)
	}
}
