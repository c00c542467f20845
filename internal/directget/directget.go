// Package directget reads stored messages of a JetStream stream with
// direct gets ($JS.API.DIRECT.GET.<stream>, on streams with allow_direct),
// in batches: a stateless read that creates no consumer. A user that only
// reads a stream then needs no permission to create consumers, which
// nats-server would not check against the consumer's deliver subject (a
// push consumer may deliver on any subject, sms.send included, whatever
// its creator may publish).
package directget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// Request is a batch direct get (nats-server 2.11 and later).
type Request struct {
	// Seq is the first sequence to return (a message at or after it).
	Seq uint64 `json:"seq,omitempty"`
	// NextFor keeps messages of this subject (wildcards allowed).
	NextFor string `json:"next_by_subj,omitempty"`
	// Batch is the most messages returned; required for a batch.
	Batch int `json:"batch,omitempty"`
	// StartTime starts at the first message stored at or after it.
	StartTime *time.Time `json:"start_time,omitempty"`
	// MultiLastFor returns the last message of each subject matching these.
	MultiLastFor []string `json:"multi_last,omitempty"`
	// UpToSeq stops at this sequence.
	UpToSeq uint64 `json:"up_to_seq,omitempty"`
}

// Msg is one stored message.
type Msg struct {
	Subject string
	Seq     uint64
	Time    time.Time
	// Header holds the message's own headers and the server's Nats-*.
	Header nats.Header
	Data   []byte
}

// ErrNoMessages is a request that matched no message.
var ErrNoMessages = errors.New("directget: no message matches")

// Subject is the direct get subject of stream.
func Subject(stream string) string { return "$JS.API.DIRECT.GET." + stream }

// Get sends req for stream on nc and returns the messages, in stream
// order, up to the end of the batch; ErrNoMessages when none matched. The
// reply comes on a new inbox of nc (its custom inbox prefix, if any).
func Get(ctx context.Context, nc *nats.Conn, stream string, req Request) ([]Msg, error) {
	if req.Batch <= 0 && len(req.MultiLastFor) == 0 {
		return nil, errors.New("directget: a request needs Batch or MultiLastFor")
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("directget %s: %w", stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(Subject(stream), inbox, body); err != nil {
		return nil, fmt.Errorf("directget %s: %w", stream, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	var out []Msg
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("directget %s: %w", stream, err)
		}
		if status := m.Header.Get("Status"); status != "" {
			switch status {
			case "204": // the end of the batch
				return out, nil
			case "404":
				if len(out) > 0 {
					return out, nil
				}
				return nil, ErrNoMessages
			case "503":
				return nil, fmt.Errorf("directget %s: no responders (no such stream, or allow_direct is off): %w", stream, nats.ErrNoResponders)
			default:
				return nil, fmt.Errorf("directget %s: status %s %s", stream, status, m.Header.Get("Description"))
			}
		}
		dm := Msg{Subject: m.Header.Get("Nats-Subject"), Header: m.Header, Data: m.Data}
		if dm.Seq, err = strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64); err != nil {
			return nil, fmt.Errorf("directget %s: a message without Nats-Sequence", stream)
		}
		if ts := m.Header.Get("Nats-Time-Stamp"); ts != "" {
			dm.Time, _ = time.Parse(time.RFC3339Nano, ts)
		}
		for _, h := range []string{"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending", "Nats-Last-Sequence"} {
			dm.Header.Del(h)
		}
		out = append(out, dm)
		if req.Batch > 0 && len(out) > req.Batch+1 {
			return nil, fmt.Errorf("directget %s: more than the %d messages asked for", stream, req.Batch)
		}
	}
}
