// Package deadletter publishes and reads the dead letters of sendonce: one
// message on sms.dlq (stream SMS_DLQ) per message finished without being sent,
// carrying the original sms.send payload and Sendonce-* headers.
package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/directget"
	"github.com/sendonce/sendonce/internal/safetext"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/wire"
)

// Letter is one dead letter.
type Letter struct {
	// OutboxID is the row, uuid.Nil for a message that named no row.
	OutboxID uuid.UUID
	// Gen is the publish generation the letter ends.
	Gen int32
	// Reason is wire.ReasonPermanent, ReasonMaxAttempts, ReasonAmbiguous or
	// ReasonInvalid.
	Reason string
	// Error is the last error, without personal data.
	Error string
	// Attempts is the number of attempts made.
	Attempts int
	// ProviderCode is the provider's error code, 0 when none.
	ProviderCode int
	// Payload is the original sms.send payload.
	Payload []byte
	// StreamSeq identifies a letter for a message that named no row: the
	// sequence of that message in the SMS stream.
	StreamSeq uint64
	// Idempotency records whether sending the row again is covered by its
	// idempotency key, when the publisher knew: the provider the row's
	// attempts went to honours keys, and no other provider of the list may
	// have the message (Elsewhere). An operator replay of an unknown row is
	// safe only then.
	Idempotency Idempotency
	// Elsewhere names another provider of SMS_PROVIDERS that may have the
	// message and could not be asked ("another" when the sender could not
	// ask them all); empty when none may. Such a letter's Idempotency is
	// ProviderNotIdempotent, whatever the row's own provider does.
	Elsewhere string

	// Seq and Time are set on letters read back from the stream.
	Seq  uint64
	Time time.Time
}

// Idempotency says what a dead letter's publisher knew of the provider.
type Idempotency int8

// The values of Idempotency; the zero value is "not known".
const (
	IdempotencyUnknown Idempotency = iota
	ProviderIdempotent
	ProviderNotIdempotent
)

// MsgID returns the letter's Nats-Msg-Id: one per row and publish
// generation, so that dead-lettering the same publication twice (a crash
// between the letter and the status write) stores one letter, while a
// replayed row that dies again gets a new one.
func (l Letter) MsgID() string {
	if l.OutboxID == uuid.Nil {
		return "dlq:seq:" + strconv.FormatUint(l.StreamSeq, 10)
	}
	return "dlq:" + l.OutboxID.String() + ":" + strconv.Itoa(int(l.Gen))
}

// Publisher publishes dead letters.
type Publisher struct {
	// JetStream publishes; required.
	JetStream jetstream.JetStream
	// Subject and Stream default to "sms.dlq" and "SMS_DLQ".
	Subject, Stream string
	// Timeout bounds one publication; default 10s.
	Timeout time.Duration
}

// Publish stores l, waits for its PubAck and returns the letter's stream
// sequence; a duplicate counts as stored (JetStream then answers with the
// sequence of the letter stored first).
func (p Publisher) Publish(ctx context.Context, l Letter) (uint64, error) {
	subject, stream := p.Subject, p.Stream
	if subject == "" {
		subject = streams.SubjectDeadLetter
	}
	if stream == "" {
		stream = streams.DeadLetterStream
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	m := nats.NewMsg(subject)
	m.Data = l.Payload
	if l.OutboxID != uuid.Nil {
		m.Header.Set(wire.HeaderOutboxID, l.OutboxID.String())
	}
	m.Header.Set(wire.HeaderReason, l.Reason)
	m.Header.Set(wire.HeaderError, l.Error)
	m.Header.Set(wire.HeaderAttempts, strconv.Itoa(l.Attempts))
	m.Header.Set(wire.HeaderGen, strconv.Itoa(int(l.Gen)))
	if l.ProviderCode != 0 {
		m.Header.Set(wire.HeaderProviderCode, strconv.Itoa(l.ProviderCode))
	}
	if l.Elsewhere != "" {
		m.Header.Set(wire.HeaderElsewhere, l.Elsewhere)
	}
	switch l.Idempotency {
	case ProviderIdempotent:
		m.Header.Set(wire.HeaderIdempotent, "true")
	case ProviderNotIdempotent:
		m.Header.Set(wire.HeaderIdempotent, "false")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	ack, err := p.JetStream.PublishMsg(ctx, m, jetstream.WithMsgID(l.MsgID()), jetstream.WithExpectStream(stream))
	if err != nil {
		return 0, fmt.Errorf("publish dead letter: %w", err)
	}
	return ack.Sequence, nil
}

// Filter selects dead letters.
type Filter struct {
	// Reason, when set, keeps letters with this reason.
	Reason string
	// Since, when set, keeps letters stored at or after it.
	Since time.Time
	// OutboxID, when set, keeps the letters of one row.
	OutboxID uuid.UUID
	// Through, when set, keeps letters stored at or before this stream
	// sequence: a reader that works while letters arrive (a replay whose
	// rows die again) reads only those stored when it began.
	Through uint64
}

func (f Filter) keep(l Letter) bool {
	return (f.Reason == "" || l.Reason == f.Reason) && (f.OutboxID == uuid.Nil || l.OutboxID == f.OutboxID) &&
		(f.Since.IsZero() || !l.Time.Before(f.Since))
}

// FetchSize is the most letters Scan holds at once: one fetch from the
// stream.
const FetchSize = 256

// Scan calls fn with each dead letter of stream (default "SMS_DLQ") that
// matches f, in stream order, starting after sequence after (0: from the
// start, or from f.Since), until fn returns false or the letters stored when
// it began are read. It holds at most FetchSize letters at a time, whatever
// the stream's size, and reads with direct gets: no consumer is
// created, so a reader needs no permission to create one, and any number
// of readers at once read independently.
func Scan(ctx context.Context, js jetstream.JetStream, stream string, f Filter, after uint64, fn func(Letter) (bool, error)) error {
	if stream == "" {
		stream = streams.DeadLetterStream
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	if f.Through > 0 {
		last = min(last, f.Through)
	}
	if info.State.Msgs == 0 || after >= last {
		return nil
	}
	req := directget.Request{Seq: info.State.FirstSeq}
	if subs := info.Config.Subjects; len(subs) == 1 {
		req.NextFor = subs[0]
	}
	seen := info.State.FirstSeq - 1
	switch {
	case after > 0:
		req.Seq = max(after+1, info.State.FirstSeq)
		seen = max(seen, after)
	case !f.Since.IsZero():
		since := f.Since
		req.Seq, req.StartTime = 0, &since
	}
	for seen < last {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Ask for no more than remain.
		req.Batch = int(min(FetchSize, last-seen))
		req.UpToSeq = last
		batch, err := directget.Get(ctx, js.Conn(), stream, req)
		if errors.Is(err, directget.ErrNoMessages) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read dead letters: %w", err)
		}
		for _, m := range batch {
			l, err := parseStored(m)
			if err != nil {
				return err
			}
			seen = l.Seq
			if seen > last {
				return nil
			}
			if !f.keep(l) {
				continue
			}
			more, err := fn(l)
			if err != nil || !more {
				return err
			}
		}
		if len(batch) == 0 {
			return nil
		}
		req.Seq, req.StartTime = seen+1, nil
	}
	return nil
}

// LastSeq returns the sequence of the newest letter of stream (default
// "SMS_DLQ"), 0 when it holds none.
func LastSeq(ctx context.Context, js jetstream.JetStream, stream string) (uint64, error) {
	if stream == "" {
		stream = streams.DeadLetterStream
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("dead-letter stream %s: %w", stream, err)
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	return info.State.LastSeq, nil
}

// Page returns up to limit dead letters matching f stored after sequence
// after, and the cursor of the next page: the sequence of the last letter
// returned when more may follow (pass it as after), 0 when the stream holds
// no more. It holds at most limit letters and one fetch, whatever the
// stream's size.
func Page(ctx context.Context, js jetstream.JetStream, stream string, f Filter, after uint64, limit int) ([]Letter, uint64, error) {
	if limit <= 0 {
		return nil, 0, errors.New("dead letters: a page needs a positive limit")
	}
	var out []Letter
	full := false
	err := Scan(ctx, js, stream, f, after, func(l Letter) (bool, error) {
		if len(out) == limit {
			full = true // a letter beyond the page: there is a next one
			return false, nil
		}
		out = append(out, l)
		return true, nil
	})
	if err != nil {
		return nil, 0, err
	}
	if !full {
		return out, 0, nil
	}
	return out, out[len(out)-1].Seq, nil
}

// List reads every dead letter of stream (default "SMS_DLQ") matching f, in
// stream order. It holds them all: operator commands read Page by Page.
func List(ctx context.Context, js jetstream.JetStream, stream string, f Filter) ([]Letter, error) {
	var out []Letter
	err := Scan(ctx, js, stream, f, 0, func(l Letter) (bool, error) {
		out = append(out, l)
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Parse reads a dead letter back from a stream message. Its text is made
// fit for an operator's screen (safetext): whoever may publish on sms.dlq
// can store a letter, so its Reason and Error may hold terminal controls,
// bidi overrides or a number.
func Parse(m jetstream.Msg) (Letter, error) {
	var seq uint64
	var ts time.Time
	if md, err := m.Metadata(); err == nil {
		seq, ts = md.Sequence.Stream, md.Timestamp
	}
	return parse(m.Headers(), m.Data(), seq, ts)
}

// parseStored is Parse for a message read by a direct get.
func parseStored(m directget.Msg) (Letter, error) {
	return parse(m.Header, m.Data, m.Seq, m.Time)
}

func parse(h nats.Header, data []byte, seq uint64, ts time.Time) (Letter, error) {
	l := Letter{Reason: safetext.Field(h.Get(wire.HeaderReason)), Error: safetext.Field(h.Get(wire.HeaderError)), Payload: data}
	if id := h.Get(wire.HeaderOutboxID); id != "" {
		u, err := uuid.Parse(id)
		if err != nil {
			return Letter{}, fmt.Errorf("dead letter with a bad %s header", wire.HeaderOutboxID)
		}
		l.OutboxID = u
	}
	l.Attempts, _ = strconv.Atoi(h.Get(wire.HeaderAttempts))
	l.ProviderCode, _ = strconv.Atoi(h.Get(wire.HeaderProviderCode))
	gen, _ := strconv.Atoi(h.Get(wire.HeaderGen))
	l.Gen = int32(gen)
	switch h.Get(wire.HeaderIdempotent) {
	case "true":
		l.Idempotency = ProviderIdempotent
	case "false":
		l.Idempotency = ProviderNotIdempotent
	}
	l.Elsewhere = safetext.Field(h.Get(wire.HeaderElsewhere))
	if l.Elsewhere != "" {
		// Written with ProviderNotIdempotent; read so whatever a header says.
		l.Idempotency = ProviderNotIdempotent
	}
	l.Seq, l.Time = seq, ts
	return l, nil
}
