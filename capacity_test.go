package sendonce_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/streams"
)

// The shipped stream and consumer settings hold the capacity rules that
// docs/operations.md ("Capacity") derives them from.
func TestShippedCapacitySettings(t *testing.T) {
	t.Parallel()
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	sms, err := topo.Stream(streams.Stream)
	if err != nil {
		t.Fatal(err)
	}
	// Postgres and the reconciler cover rows older than MaxAge: a day or
	// two of messages, bounded in bytes, refusing new publications (the
	// rows stay pending, the relay-lag alert fires) rather than dropping
	// messages not yet delivered.
	if sms.MaxAge < 24*time.Hour || sms.MaxAge > 48*time.Hour {
		t.Errorf("SMS max_age = %s, want 24-48h", sms.MaxAge)
	}
	if sms.MaxBytes <= 0 || sms.Discard != jetstream.DiscardNew {
		t.Errorf("SMS max_bytes = %d, discard = %v; want a bound and discard new", sms.MaxBytes, sms.Discard)
	}
	// About 150 bytes stored per message: a day at the 100M rows/day plan
	// (1,160 msg/s) fits.
	const bytesPerMsg, planPerDay = 150, 100_000_000
	if need := int64(bytesPerMsg * planPerDay * sms.MaxAge.Hours() / 24); sms.MaxBytes < need {
		t.Errorf("SMS max_bytes = %d, below %d (MaxAge of the 100M/day plan at %d B/message)", sms.MaxBytes, need, bytesPerMsg)
	}
	// The Duplicates window covers the relay's republication horizon with
	// its default timeouts, and JetStream needs it within MaxAge.
	if h := (relay.Config{}).RepublishHorizon(); sms.Duplicates < h || sms.Duplicates > sms.MaxAge {
		t.Errorf("SMS duplicate_window = %s, want between the relay's republish horizon %s and max_age %s", sms.Duplicates, h, sms.MaxAge)
	}

	// max_ack_pending >= senders x (concurrency + claim batch) + retry rate
	// x the longest NakWithDelay kept in NATS, for the reference fleet of
	// the docs: 10 senders at the default 32 + 32, 500 retries/s at 30 s.
	c, err := topo.Consumer(streams.Stream, streams.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if need := 10*(32+32) + 500*30; c.MaxAckPending < need {
		t.Errorf("senders max_ack_pending = %d, want at least %d", c.MaxAckPending, need)
	}

	// Every dead letter can be traced to its row: by default rows and
	// letters are kept equally long.
	dlq, err := topo.Stream(streams.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	if dlq.MaxAge != relay.DefaultRetentionAge {
		t.Errorf("SMS_DLQ max_age = %s, relay default retention %s: want them equal", dlq.MaxAge, relay.DefaultRetentionAge)
	}

	// Dead letters are bounded in bytes too, refusing new letters when
	// full: a refused letter stays due on its row and the reconciler
	// stores it once there is room, while discard old would drop stored
	// letters in silence. The bound holds max_age of letters at 1 % of
	// the plan, at 450 B each (a letter with a short error takes 432 B
	// of store), and 50,000 letters of max_msg_size (an invalid payload
	// kept whole) at any time.
	if dlq.MaxBytes <= 0 || dlq.Discard != jetstream.DiscardNew {
		t.Errorf("SMS_DLQ max_bytes = %d, discard = %v; want a bound and discard new", dlq.MaxBytes, dlq.Discard)
	}
	const letterBytes, deadPerDay = 450, planPerDay / 100
	if need := int64(letterBytes * deadPerDay * dlq.MaxAge.Hours() / 24); dlq.MaxBytes < need {
		t.Errorf("SMS_DLQ max_bytes = %d, below %d (max_age of letters at 1%% of the 100M/day plan, %d B each)", dlq.MaxBytes, need, letterBytes)
	}
	if need := 50_000 * int64(dlq.MaxMsgSize); dlq.MaxMsgSize <= 0 || dlq.MaxBytes < need {
		t.Errorf("SMS_DLQ max_bytes = %d, below 50,000 letters of max_msg_size %d", dlq.MaxBytes, dlq.MaxMsgSize)
	}
	// JetStream reserves every stream's max_bytes in the server's
	// max_file_store: keep the two within 24 GiB.
	if sum := sms.MaxBytes + dlq.MaxBytes; sum > 24<<30 {
		t.Errorf("SMS and SMS_DLQ max_bytes add up to %d, over 24 GiB of reserved store", sum)
	}
}
