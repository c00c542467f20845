// Command receiver takes delivery receipts from the SMS provider and records
// them in the outbox: POST /v1/receipts/generic (signed with
// Sendonce-Signature), POST /v1/receipts/twilio (signed with
// X-Twilio-Signature), POST /v1/receipts/vonage (a JWT signed with
// Vonage's signature secret), POST /v1/receipts/sinch (an HMAC under
// Sinch's callback secret) and POST /v1/receipts/telnyx (Ed25519, under the
// key pair whose public key Telnyx gives the account). A receipt moves its row forward only (to
// delivered or undelivered, or an unknown one to sent), and is answered 2xx
// once that is committed. Beside each, POST /v1/inbound/<provider> takes
// the provider's inbound messages, signed the same way: a recipient's STOP
// puts the number on the suppression list, a START lifts it. It needs
// Postgres only.
//
// Every flag has an environment variable; run "receiver -h" for the list.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/tracing"
)

func main() { proc.Main(run) }

// Announcement starts the line the receiver prints on stdout once it
// listens, followed by its base URL.
const Announcement = "receiver listening on "

type config struct {
	service.Settings
	// tracing is the process's traces (OTEL_*); nil when off.
	tracing        *tracing.Tracing
	addr           string
	secret         string
	previousSecret string
	twilioToken    string
	vonageSecret   string
	sinchSecret    string
	telnyxKey      string
	publicURL      string
	defaultProv    string
	allowInsecure  bool
	tlsCert        string
	tlsKey         string
	window         time.Duration
}

func bind(s *envflag.Set, c *config) {
	service.BindDatabase(s, &c.Database)
	s.Group("receipts: where they arrive, and the providers' signing secrets")
	s.String(&c.addr, "receipts-addr", "RECEIPTS_ADDR", ":8088", "address the receipt endpoints listen on (the provider calls it)")
	s.Secret(&c.secret, "sms-webhook-secret", "SMS_WEBHOOK_SECRET", "shared secret (at least 16 bytes) that signs generic receipts (Sendonce-Signature); enables /v1/receipts/generic and /v1/inbound/generic (inbound messages, signed the same way)")
	s.Secret(&c.previousSecret, "sms-webhook-secret-previous", "SMS_WEBHOOK_SECRET_PREVIOUS", "the secret being rotated out, accepted as well until the provider signs with the new one")
	s.Secret(&c.twilioToken, "twilio-auth-token", "TWILIO_AUTH_TOKEN", "Twilio auth token that signs status callbacks (X-Twilio-Signature); enables /v1/receipts/twilio and /v1/inbound/twilio (incoming messages, signed the same way)")
	s.Secret(&c.vonageSecret, "vonage-signature-secret", "VONAGE_SIGNATURE_SECRET", "Vonage signature secret that signs Messages API status webhooks (a JWT in Authorization: Bearer); enables /v1/receipts/vonage and /v1/inbound/vonage (inbound messages, signed the same way)")
	s.Secret(&c.sinchSecret, "sinch-callback-secret", "SINCH_CALLBACK_SECRET", "Sinch callback secret that signs SMS delivery reports (X-Sinch-Webhook-Signature, an HMAC-SHA256 with a nonce and a timestamp; Sinch sets it up for the service plan); enables /v1/receipts/sinch and /v1/inbound/sinch (MO messages, signed the same way)")
	s.String(&c.telnyxKey, "telnyx-public-key", "TELNYX_PUBLIC_KEY", "", "Telnyx public key (base64, from Telnyx's portal) that verifies the Ed25519 signatures of Messaging webhooks; enables /v1/receipts/telnyx and /v1/inbound/telnyx (message.received, signed the same way)")
	s.String(&c.publicURL, "receipts-public-url", "RECEIPTS_PUBLIC_URL", "", "this receiver's base URL as the provider calls it (Twilio signs the full URL); required with TWILIO_AUTH_TOKEN")
	s.URL(&c.publicURL, "receipts-public-url", "http", "https")
	s.String(&c.defaultProv, "receipts-default-provider", "RECEIPTS_DEFAULT_PROVIDER", "",
		"the provider whose receipts may settle rows that name none (sent with a single SMS_PROVIDER, or attempted before migration 0019): generic, twilio, vonage, sinch, telnyx or none; set it to SMS_PROVIDER when this receiver verifies more than one provider's receipts; empty: the one provider it verifies, or none when it verifies several (docs/receipts.md)")
	provider.BindReceiptsAllowInsecure(s, &c.allowInsecure)
	s.String(&c.tlsCert, "receipts-tls-cert", "RECEIPTS_TLS_CERT", "", "certificate file (PEM) to serve HTTPS; with RECEIPTS_TLS_KEY (else terminate TLS in front)")
	s.String(&c.tlsKey, "receipts-tls-key", "RECEIPTS_TLS_KEY", "", "private key file (PEM) of RECEIPTS_TLS_CERT")
	s.Duration(&c.window, "receipts-batch-window", "RECEIPTS_BATCH_WINDOW", receiver.DefaultWindow, 0, time.Second, "how long a write waits for more receipts to share its transaction")
	s.Group("health, logs and timeouts")
	service.BindHTTPAddr(s, &c.HTTPAddr, "127.0.0.1:9103")
	s.Enum(&c.LogFormat, "log-format", "LOG_FORMAT", "json", []string{"json", "text"}, "log format")
	s.Enum(&c.LogLevel, "log-level", "LOG_LEVEL", "info", []string{"debug", "info", "warn", "error"}, "log level")
	s.Duration(&c.DBTimeout, "db-timeout", "DB_TIMEOUT", outbox.DefaultDBTimeout, 100*time.Millisecond, 10*time.Minute, "bound on each database round trip")
	s.Duration(&c.ShutdownTimeout, "shutdown-timeout", "SHUTDOWN_TIMEOUT", service.DefaultShutdownTimeout, time.Second, time.Hour, "bound on a graceful shutdown")
	s.Check(func() error {
		switch {
		case c.secret == "" && c.twilioToken == "" && c.vonageSecret == "" && c.sinchSecret == "" && c.telnyxKey == "":
			return errors.New("SMS_WEBHOOK_SECRET (or TWILIO_AUTH_TOKEN, VONAGE_SIGNATURE_SECRET, SINCH_CALLBACK_SECRET or TELNYX_PUBLIC_KEY) is required: nothing could verify a receipt")
		case c.secret != "" && len(c.secret) < 16:
			return errors.New("SMS_WEBHOOK_SECRET must be at least 16 bytes")
		case c.previousSecret != "" && c.secret == "":
			return errors.New("SMS_WEBHOOK_SECRET_PREVIOUS is set without SMS_WEBHOOK_SECRET")
		case c.previousSecret != "" && len(c.previousSecret) < 16:
			return errors.New("SMS_WEBHOOK_SECRET_PREVIOUS must be at least 16 bytes")
		case c.twilioToken != "" && c.publicURL == "":
			return errors.New("-receipts-public-url / RECEIPTS_PUBLIC_URL is required with TWILIO_AUTH_TOKEN: Twilio signs the URL it calls")
		case c.telnyxKey != "" && !validTelnyxKey(c.telnyxKey):
			return errors.New("-telnyx-public-key / TELNYX_PUBLIC_KEY must be the 32-byte Ed25519 public key in base64, as Telnyx's portal gives it")
		case (c.tlsCert == "") != (c.tlsKey == ""):
			return errors.New("RECEIPTS_TLS_CERT and RECEIPTS_TLS_KEY go together")
		case !slices.Contains([]string{"", "generic", "twilio", "vonage", "sinch", "telnyx", "none"}, c.defaultProv):
			return fmt.Errorf("-receipts-default-provider / RECEIPTS_DEFAULT_PROVIDER = %q: must be generic, twilio, vonage, sinch, telnyx or none", c.defaultProv)
		case !verifies(c, c.defaultProv):
			return fmt.Errorf("-receipts-default-provider / RECEIPTS_DEFAULT_PROVIDER=%s: this receiver verifies no %s receipts (set that provider's secret, or name another)", c.defaultProv, c.defaultProv)
		}
		return provider.ReceiptsURLCheck(c.publicURL, c.allowInsecure)
	})
}

// verifies reports whether c verifies the receipts of provider; "" and
// "none" need none.
func verifies(c *config, provider string) bool {
	switch provider {
	case "generic":
		return c.secret != ""
	case "twilio":
		return c.twilioToken != ""
	case "vonage":
		return c.vonageSecret != ""
	case "sinch":
		return c.sinchSecret != ""
	case "telnyx":
		return c.telnyxKey != ""
	}
	return true
}

func validTelnyxKey(s string) bool {
	_, err := receiver.ParseTelnyxPublicKey(s)
	return err == nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var c config
	s := envflag.New("receiver", getenv, stderr)
	bind(s, &c)
	root, code := service.Parse("receiver", s, args[1:], &c.Settings, stderr)
	if root == nil {
		return code
	}
	log := root.With("component", "receiver")
	return service.RunTraced(ctx, "sendonce-receiver", "receiver", getenv, log, func(tr *tracing.Tracing) error {
		c.tracing = tr
		return serve(ctx, c, root, log, stdout)
	})
}

func serve(ctx context.Context, c config, root, log *slog.Logger, stdout io.Writer) error {
	tel, err := service.StartTelemetryWithoutNATS(c.HTTPAddr, log)
	if err != nil {
		return err
	}
	defer tel.Stop()
	pool, err := service.OpenDatabase(ctx, c.Database, service.Options{Telemetry: tel, Name: "sendonce-receiver", MinConns: 2, GenericPlans: true}, log)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("receiver stopped before it started", "err", err)
			return nil
		}
		return err
	}
	defer pool.Close()
	var secrets [][]byte
	for _, sec := range []string{c.secret, c.previousSecret} {
		if sec != "" {
			secrets = append(secrets, []byte(sec))
		}
	}
	var telnyxKey []byte
	if c.telnyxKey != "" {
		if telnyxKey, err = receiver.ParseTelnyxPublicKey(c.telnyxKey); err != nil {
			return fmt.Errorf("TELNYX_PUBLIC_KEY: %w", err)
		}
	}
	rv, err := receiver.New(receiver.Config{
		Pool: pool, Secrets: secrets, TwilioToken: c.twilioToken, VonageSecret: []byte(c.vonageSecret), SinchSecret: []byte(c.sinchSecret),
		TelnyxPublicKey: telnyxKey, PublicURL: c.publicURL, DefaultProvider: c.defaultProv, Window: c.window, DBTimeout: c.DBTimeout, Logger: root, Registerer: tel.Registry,
		Tracing: c.tracing,
	})
	if err != nil {
		return err
	}
	tel.SetReady(rv.Ready)
	ln, scheme, err := service.Listen(c.addr, c.tlsCert, c.tlsKey, "RECEIPTS")
	if err != nil {
		return err
	}
	log.Info("receiver started", "addr", ln.Addr().String(), "generic", len(secrets) > 0, "twilio", c.twilioToken != "", "vonage", c.vonageSecret != "", "sinch", c.sinchSecret != "", "telnyx", c.telnyxKey != "",
		"default_provider", rv.DefaultProvider(),
		"tls", c.tlsCert != "", "batch_window", c.window.String())
	if _, err := fmt.Fprintf(stdout, "%s%s://%s\n", Announcement, scheme, ln.Addr()); err != nil {
		ln.Close()
		return err
	}
	if err := rv.Serve(ctx, ln, c.ShutdownTimeout); err != nil {
		return err
	}
	log.Info("receiver stopped")
	return nil
}
