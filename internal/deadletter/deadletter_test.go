package deadletter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/wire"
)

// Dead-lettering the same publication twice (a crash between the letter and
// the status write) stores one letter; a new generation (a replayed row that
// dies again) stores another. List reads them back with every header.
func TestPublishIsDeduplicatedPerGeneration(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.EnsureTopology(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := deadletter.Publisher{JetStream: js}
	id := uuid.New()
	l := deadletter.Letter{
		OutboxID: id, Reason: wire.ReasonPermanent, Error: "http 400: invalid To", Attempts: 1, ProviderCode: 21211,
		Payload: wire.AppendEncode(nil, wire.Send{ID: id}),
	}
	for range 3 {
		if _, err := p.Publish(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	l.Gen = 1
	if _, err := p.Publish(ctx, l); err != nil {
		t.Fatal(err)
	}
	other := deadletter.Letter{Reason: wire.ReasonInvalid, Error: "not json", Payload: []byte("x"), StreamSeq: 7}
	if _, err := p.Publish(ctx, other); err != nil {
		t.Fatal(err)
	}
	all, err := deadletter.List(ctx, js, "", deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 {
		t.Fatalf("%d letters stored, want 3 (one per generation, one invalid)", len(all))
	}
	mine, err := deadletter.List(ctx, js, "", deadletter.Filter{OutboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(mine) != 2 || mine[0].Gen != 0 || mine[1].Gen != 1 {
		t.Fatalf("letters of the row = %+v", mine)
	}
	got := mine[0]
	if got.Reason != wire.ReasonPermanent || got.ProviderCode != 21211 || got.Attempts != 1 || got.Error != l.Error || got.Seq == 0 || got.Time.IsZero() {
		t.Fatalf("letter read back = %+v", got)
	}
	if p, err := wire.Decode(got.Payload); err != nil || p.ID != id {
		t.Fatalf("payload = %q, %v", got.Payload, err)
	}
	invalid, err := deadletter.List(ctx, js, "", deadletter.Filter{Reason: wire.ReasonInvalid})
	if err != nil || len(invalid) != 1 || invalid[0].OutboxID != uuid.Nil {
		t.Fatalf("invalid letters = %+v, %v", invalid, err)
	}
}

// A letter that names another provider which may have the message reads
// back as not covered by the key, even if a header said otherwise: its
// replay target is never safe.
func TestALetterNamingAnotherProviderIsNeverSafe(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.EnsureTopology(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := uuid.New()
	l := deadletter.Letter{
		OutboxID: id, Reason: wire.ReasonAmbiguous, Error: "an earlier attempt was lost", Elsewhere: "twilio",
		Idempotency: deadletter.ProviderNotIdempotent, Payload: wire.AppendEncode(nil, wire.Send{ID: id}),
	}
	if _, err := (deadletter.Publisher{JetStream: js}).Publish(ctx, l); err != nil {
		t.Fatal(err)
	}
	// A publisher that got the idempotency wrong.
	forged := nats.NewMsg("sms.dlq")
	other := uuid.New()
	forged.Data = wire.AppendEncode(nil, wire.Send{ID: other})
	forged.Header.Set(wire.HeaderOutboxID, other.String())
	forged.Header.Set(wire.HeaderReason, wire.ReasonAmbiguous)
	forged.Header.Set(wire.HeaderIdempotent, "true")
	forged.Header.Set(wire.HeaderElsewhere, "vonage")
	if _, err := js.PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	all, err := deadletter.List(ctx, js, "", deadletter.Filter{})
	if err != nil || len(all) != 2 {
		t.Fatalf("letters = %+v, %v", all, err)
	}
	for i, want := range []string{"twilio", "vonage"} {
		got := all[i]
		if got.Elsewhere != want || got.Idempotency != deadletter.ProviderNotIdempotent || got.ReplayTarget().SafeUnknown {
			t.Errorf("letter %d read back = %+v; want elsewhere %s, not safe to replay", i, got, want)
		}
	}
}

// Page returns at most limit letters and the cursor of the next page, with a
// filter that skips most of the stream; Through stops at a sequence; the
// pages together hold each matching letter once.
func TestPage(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.EnsureTopology(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := deadletter.Publisher{JetStream: js}
	var matching []uint64
	for i := range 700 {
		reason := wire.ReasonPermanent
		if i%3 == 0 {
			reason = wire.ReasonMaxAttempts
		}
		seq, err := p.Publish(ctx, deadletter.Letter{OutboxID: uuid.New(), Reason: reason, Payload: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if reason == wire.ReasonMaxAttempts {
			matching = append(matching, seq)
		}
	}
	f := deadletter.Filter{Reason: wire.ReasonMaxAttempts}
	var got []uint64
	after, pages := uint64(0), 0
	for {
		page, next, err := deadletter.Page(ctx, js, "", f, after, 50)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(page) > 50 {
			t.Fatalf("page %d holds %d letters, over its limit of 50", pages, len(page))
		}
		for _, l := range page {
			if l.Reason != wire.ReasonMaxAttempts {
				t.Fatalf("page %d holds a %s letter", pages, l.Reason)
			}
			got = append(got, l.Seq)
		}
		if next == 0 {
			break
		}
		if len(page) != 50 || next != page[len(page)-1].Seq {
			t.Fatalf("page %d: %d letters, next %d", pages, len(page), next)
		}
		after = next
	}
	if fmt.Sprint(got) != fmt.Sprint(matching) || pages != (len(matching)+49)/50 {
		t.Fatalf("%d pages held %d letters, want %d in %d pages", pages, len(got), len(matching), (len(matching)+49)/50)
	}

	f.Through = matching[9]
	page, next, err := deadletter.Page(ctx, js, "", f, 0, 50)
	if err != nil || len(page) != 10 || next != 0 || page[9].Seq != matching[9] {
		t.Fatalf("through %d: %d letters, next %d, %v", f.Through, len(page), next, err)
	}
	if _, _, err := deadletter.Page(ctx, js, "", f, 0, 0); err == nil {
		t.Fatal("a page of 0 letters was accepted")
	}
}
