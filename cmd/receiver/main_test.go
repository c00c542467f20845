package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestSettingsDoc(t *testing.T) { testkit.SettingsDoc(t, "receiver", bind) }

func TestBadConfigurationNamesTheSetting(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "nope")
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"missing database url", map[string]string{"DATABASE_URL": ""}, "DATABASE_URL"},
		{"no way to verify", map[string]string{"SMS_WEBHOOK_SECRET": ""}, "SMS_WEBHOOK_SECRET"},
		{"short secret", map[string]string{"SMS_WEBHOOK_SECRET": "short"}, "SMS_WEBHOOK_SECRET"},
		{"secret file missing", map[string]string{"SMS_WEBHOOK_SECRET": "", "SMS_WEBHOOK_SECRET_FILE": missing}, "SMS_WEBHOOK_SECRET_FILE"},
		{"twilio without its URL", map[string]string{"TWILIO_AUTH_TOKEN": "tok"}, "RECEIPTS_PUBLIC_URL"},
		{"public url not a url", map[string]string{"RECEIPTS_PUBLIC_URL": "receipts.example"}, "RECEIPTS_PUBLIC_URL"},
		{"public url over http", map[string]string{"RECEIPTS_PUBLIC_URL": "http://receipts.example"}, "RECEIPTS_ALLOW_INSECURE"},
		{"twilio url over http", map[string]string{"TWILIO_AUTH_TOKEN": "tok", "RECEIPTS_PUBLIC_URL": "HTTP://receipts.example"}, "RECEIPTS_PUBLIC_URL"},
		{"cert without key", map[string]string{"RECEIPTS_TLS_CERT": "/x.pem"}, "RECEIPTS_TLS_KEY"},
		{"window out of range", map[string]string{"RECEIPTS_BATCH_WINDOW": "1h"}, "RECEIPTS_BATCH_WINDOW"},
		{"telnyx key not base64", map[string]string{"TELNYX_PUBLIC_KEY": "not a key"}, "TELNYX_PUBLIC_KEY"},
		{"telnyx key too short", map[string]string{"SMS_WEBHOOK_SECRET": "", "TELNYX_PUBLIC_KEY": "AAAA"}, "TELNYX_PUBLIC_KEY"},
		{"default provider unknown", map[string]string{"RECEIPTS_DEFAULT_PROVIDER": "acme"}, "RECEIPTS_DEFAULT_PROVIDER"},
		{"default provider not verified", map[string]string{"RECEIPTS_DEFAULT_PROVIDER": "twilio"}, "RECEIPTS_DEFAULT_PROVIDER"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:5432/x", "SMS_WEBHOOK_SECRET": "0123456789abcdef-secret"}
			for k, v := range tt.env {
				env[k] = v
			}
			var out, errOut testkit.Buffer
			code := run(context.Background(), []string{"receiver"}, testkit.EnvMap(env), &out, &errOut)
			if code != 2 || !strings.Contains(errOut.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 naming %s", code, errOut.String(), tt.want)
			}
			if strings.Contains(errOut.String(), "0123456789abcdef-secret") {
				t.Fatal("the secret was printed")
			}
		})
	}
}

// The binary's run: the secret from a file, a signed receipt answered after
// it is written, a forged one refused, and a clean stop.
func TestRunRecordsReceipts(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewMigrated(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	id := uuid.New()
	if _, err := pool.Exec(context.Background(), `INSERT INTO sms_outbox (id, to_e164, body, status) VALUES ($1, '+15551230000', 'b', 'sent')`, id); err != nil {
		t.Fatal(err)
	}
	secret := "receiver-test-secret-0123456789"
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"DATABASE_URL": pgtest.AsRole(t, dsn, "sendonce_receiver"), "SMS_WEBHOOK_SECRET_FILE": secretFile,
		"RECEIPTS_ADDR": "127.0.0.1:0", "HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "debug",
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut testkit.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"receiver"}, testkit.EnvMap(env), &out, &errOut) }()
	var base string
	testkit.WaitFor(t, 30*time.Second, "the receiver to listen", func() bool {
		line, ok := strings.CutPrefix(strings.TrimSpace(out.String()), Announcement)
		base = line
		return ok
	})
	body, _ := json.Marshal(map[string]any{"id": "msg_77", "reference": id.String(), "status": "delivered"})
	post := func(sig string) int {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/receipts/generic", bytes.NewReader(body))
		req.Header.Set(receiver.HeaderSignature, sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(receiver.SignGeneric([]byte("not-the-secret-of-this-receiver"), body, time.Now())); code != http.StatusUnauthorized {
		t.Errorf("forged receipt: %d, want 401", code)
	}
	if code := post(receiver.SignGeneric([]byte(secret), body, time.Now())); code != http.StatusOK {
		t.Fatalf("signed receipt: %d, want 200", code)
	}
	var status string
	if err := pool.QueryRow(context.Background(), `SELECT status FROM sms_outbox WHERE id = $1`, id).Scan(&status); err != nil || status != "delivered" {
		t.Fatalf("row is %q (%v) once the receipt was answered, want delivered", status, err)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, leak := range []string{secret, "+15551230000"} {
		if strings.Contains(errOut.String(), leak) {
			t.Errorf("the logs hold %q", leak)
		}
	}
}

// The binary with a Telnyx public key alone serves /v1/receipts/telnyx:
// a webhook signed with the account's private key moves its row, one
// signed with another key is refused.
func TestRunTakesTelnyxWebhooks(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewMigrated(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	id := uuid.New()
	if _, err := pool.Exec(context.Background(), `INSERT INTO sms_outbox (id, to_e164, body, status) VALUES ($1, '+15551230000', 'b', 'sent')`, id); err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	env := map[string]string{
		"DATABASE_URL": pgtest.AsRole(t, dsn, "sendonce_receiver"), "TELNYX_PUBLIC_KEY": base64.StdEncoding.EncodeToString(pub),
		"RECEIPTS_ADDR": "127.0.0.1:0", "HTTP_ADDR": "127.0.0.1:0",
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut testkit.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"receiver"}, testkit.EnvMap(env), &out, &errOut) }()
	var base string
	testkit.WaitFor(t, 30*time.Second, "the receiver to listen", func() bool {
		line, ok := strings.CutPrefix(strings.TrimSpace(out.String()), Announcement)
		base = line
		return ok
	})
	body, _ := json.Marshal(map[string]any{"data": map[string]any{"event_type": "message.finalized", "payload": map[string]any{
		"id": "40385f64-5717-4562-b3fc-2c963f66afa6", "direction": "outbound", "to": []map[string]string{{"status": "delivered"}},
		"webhook_url": "https://receipts.example.com/v1/receipts/telnyx?ref=" + id.String()}}})
	post := func(key ed25519.PrivateKey) int {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/receipts/telnyx", bytes.NewReader(body))
		req.Header.Set(receiver.HeaderTelnyxTimestamp, ts)
		req.Header.Set(receiver.HeaderTelnyxSignature, base64.StdEncoding.EncodeToString(ed25519.Sign(key, append([]byte(ts+"|"), body...))))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(other); code != http.StatusUnauthorized {
		t.Errorf("webhook signed with another key: %d, want 401", code)
	}
	if code := post(priv); code != http.StatusOK {
		t.Fatalf("signed webhook: %d, want 200", code)
	}
	var status string
	if err := pool.QueryRow(context.Background(), `SELECT status FROM sms_outbox WHERE id = $1`, id).Scan(&status); err != nil || status != "delivered" {
		t.Fatalf("row is %q (%v) once the webhook was answered, want delivered", status, err)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
}
