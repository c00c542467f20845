// Package wire defines what travels on the sendonce subjects: the payload of
// an sms.send message (a reference to an outbox row, never the phone number or
// the body, which stay in Postgres) and the headers of a dead letter.
package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"
)

// Dead-letter headers (docs/design.md, "Subjects, streams and messages").
const (
	HeaderOutboxID     = "Sendonce-Outbox-Id"
	HeaderReason       = "Sendonce-Reason"
	HeaderError        = "Sendonce-Error"
	HeaderAttempts     = "Sendonce-Attempts"
	HeaderProviderCode = "Sendonce-Provider-Code"
	HeaderGen          = "Sendonce-Publish-Gen"
	// HeaderIdempotent is "true" or "false": whether the provider the
	// row's attempts went to honours idempotency keys. Absent when the
	// publisher did not know (a letter the reconciler published).
	HeaderIdempotent = "Sendonce-Provider-Idempotent"
	// HeaderElsewhere names another provider of SMS_PROVIDERS that may have
	// the message and could not be asked ("another" when not every one
	// could be); absent when none may. Its letters record
	// HeaderIdempotent "false": a replay could send the message twice.
	HeaderElsewhere = "Sendonce-Elsewhere"
)

// Dead-letter reasons.
const (
	ReasonPermanent   = "permanent"
	ReasonMaxAttempts = "max_attempts"
	ReasonAmbiguous   = "ambiguous"
	ReasonInvalid     = "invalid"
)

// Send is the payload of an sms.send message.
type Send struct {
	// ID is the outbox row id.
	ID uuid.UUID `json:"id"`
	// Gen is the publish generation of this publication.
	Gen int32 `json:"gen"`
}

// MaxPayload bounds what Decode accepts; a real payload is under 64 bytes.
const MaxPayload = 1024

// ErrPayload is matched by every Decode error.
var ErrPayload = errors.New("invalid sms.send payload")

// AppendEncode appends the JSON encoding of s to b. It allocates nothing
// beyond b's growth: the relay encodes one payload per row.
func AppendEncode(b []byte, s Send) []byte {
	b = append(b, `{"id":"`...)
	var idBuf [36]byte
	encodeUUID(idBuf[:], s.ID)
	b = append(b, idBuf[:]...)
	b = append(b, `","gen":`...)
	b = strconv.AppendInt(b, int64(s.Gen), 10)
	return append(b, '}')
}

// Decode parses an sms.send payload. Anything but an object with a valid,
// non-nil id and a non-negative gen is an error wrapping ErrPayload; the
// error text never echoes the payload.
func Decode(data []byte) (Send, error) {
	if len(data) > MaxPayload {
		return Send{}, fmt.Errorf("%w: %d bytes, more than %d", ErrPayload, len(data), MaxPayload)
	}
	var raw struct {
		ID  *string `json:"id"`
		Gen *int32  `json:"gen"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Send{}, fmt.Errorf("%w: not a JSON object with id and gen", ErrPayload)
	}
	if raw.ID == nil {
		return Send{}, fmt.Errorf("%w: no id", ErrPayload)
	}
	id, err := uuid.Parse(*raw.ID)
	if err != nil || id == uuid.Nil || len(*raw.ID) != 36 {
		return Send{}, fmt.Errorf("%w: id is not a UUID", ErrPayload)
	}
	s := Send{ID: id}
	if raw.Gen != nil {
		if *raw.Gen < 0 {
			return Send{}, fmt.Errorf("%w: negative gen", ErrPayload)
		}
		s.Gen = *raw.Gen
	}
	return s, nil
}

const hexDigits = "0123456789abcdef"

func encodeUUID(dst []byte, u uuid.UUID) {
	j := 0
	for i, b := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst[j] = '-'
			j++
		}
		dst[j] = hexDigits[b>>4]
		dst[j+1] = hexDigits[b&0x0f]
		j += 2
	}
}
