package streams_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
)

func TestDefaultTopology(t *testing.T) {
	t.Parallel()
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	sms, err := topo.Stream(streams.Stream)
	if err != nil {
		t.Fatal(err)
	}
	// docs/design.md: Limits retention (WorkQueue forgets its dedup state on a
	// restart), a Duplicates window longer than the 2 min default, and one
	// within MaxAge.
	if sms.Retention != jetstream.LimitsPolicy {
		t.Errorf("SMS retention = %v, want limits", sms.Retention)
	}
	if sms.Duplicates <= 2*time.Minute || sms.Duplicates > sms.MaxAge {
		t.Errorf("SMS duplicates window = %s (max age %s)", sms.Duplicates, sms.MaxAge)
	}
	if len(sms.Subjects) == 0 || sms.Subjects[0] != streams.SubjectSend {
		t.Errorf("SMS subjects = %v", sms.Subjects)
	}
	dlq, err := topo.Stream(streams.DeadLetterStream)
	if err != nil || dlq.Subjects[0] != streams.SubjectDeadLetter || dlq.Retention != jetstream.LimitsPolicy {
		t.Errorf("SMS_DLQ = %+v, %v", dlq, err)
	}
	c, err := topo.Consumer(streams.Stream, streams.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if c.AckPolicy != jetstream.AckExplicitPolicy || c.MaxDeliver <= 8 || c.MaxAckPending <= 0 || c.AckWait <= 0 {
		t.Errorf("senders consumer = %+v", c)
	}
	if len(c.BackOff) > 0 && c.MaxDeliver < len(c.BackOff) {
		t.Errorf("MaxDeliver %d < len(BackOff) %d", c.MaxDeliver, len(c.BackOff))
	}
}

func TestLoadRefusesMistakes(t *testing.T) {
	t.Parallel()
	cases := map[string]fstest.MapFS{
		"unknown field": {"n/S.stream.json": {Data: []byte(`{"name":"S","subjectz":["a"]}`)}},
		"name mismatch": {"n/S.stream.json": {Data: []byte(`{"name":"T","subjects":["a"]}`)}},
		"orphan consumer": {
			"n/S.stream.json":     {Data: []byte(`{"name":"S","subjects":["a"]}`)},
			"n/T.c.consumer.json": {Data: []byte(`{"durable_name":"c"}`)},
		},
		"max_deliver below backoff": {
			"n/S.stream.json":     {Data: []byte(`{"name":"S","subjects":["a"]}`)},
			"n/S.c.consumer.json": {Data: []byte(`{"durable_name":"c","ack_policy":"explicit","max_deliver":2,"backoff":[1000000000,2000000000,3000000000]}`)},
		},
		"ack_wait other than backoff[0]": {
			"n/S.stream.json":     {Data: []byte(`{"name":"S","subjects":["a"]}`)},
			"n/S.c.consumer.json": {Data: []byte(`{"durable_name":"c","ack_policy":"explicit","ack_wait":30000000000,"backoff":[1000000000,2000000000]}`)},
		},
		"ack none": {
			"n/S.stream.json":     {Data: []byte(`{"name":"S","subjects":["a"]}`)},
			"n/S.c.consumer.json": {Data: []byte(`{"durable_name":"c","ack_policy":"none"}`)},
		},
		"durable mismatch": {
			"n/S.stream.json":     {Data: []byte(`{"name":"S","subjects":["a"]}`)},
			"n/S.c.consumer.json": {Data: []byte(`{"durable_name":"d"}`)},
		},
	}
	for name, fsys := range cases {
		if _, err := streams.Load(fsys, "n"); err == nil {
			t.Errorf("%s: loaded without error", name)
		}
	}
}

func TestEnsureCreatesAndIsIdempotent(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topo.Check(ctx, js); err == nil {
		t.Fatal("Check passed on an empty server")
	}
	changed, err := topo.Ensure(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	wantCreated := []string{"stream SMS created", "stream SMS_DLQ created", "consumer SMS/senders created",
		"consumer SMS/senders_bulk created", "consumer SMS/senders_urgent created"}
	if !slices.Equal(changed, wantCreated) {
		t.Fatalf("first Ensure = %q, want %q", changed, wantCreated)
	}
	// A second start-up against a matching server sends no update at all.
	if changed, err := topo.Ensure(ctx, js); err != nil || len(changed) != 0 {
		t.Fatalf("second Ensure = %q, %v; want no change", changed, err)
	}
	if err := topo.Check(ctx, js); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, streams.Stream)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := topo.Stream(streams.Stream)
	if got := s.CachedInfo().Config; got.Duplicates != want.Duplicates || got.MaxAge != want.MaxAge || got.Storage != jetstream.FileStorage {
		t.Fatalf("server stream config = %+v", got)
	}
	cons, err := js.Consumer(ctx, streams.Stream, streams.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	wantC, _ := topo.Consumer(streams.Stream, streams.Consumer)
	if got := cons.CachedInfo().Config; got.MaxDeliver != wantC.MaxDeliver || got.AckWait != wantC.AckWait || got.MaxAckPending != wantC.MaxAckPending {
		t.Fatalf("server consumer config = %+v", got)
	}
	// A config change is applied by the next start-up, and only to what changed.
	topo.Streams[0].Description = "changed"
	topo.Consumers[streams.Stream][0].MaxAckPending = 100
	changed, err = topo.Ensure(ctx, js)
	if want := []string{"stream SMS updated", "consumer SMS/senders updated"}; err != nil || !slices.Equal(changed, want) {
		t.Fatalf("Ensure after a change = %q, %v; want %q", changed, err, want)
	}
	if cons, err = js.Consumer(ctx, streams.Stream, streams.Consumer); err != nil || cons.CachedInfo().Config.MaxAckPending != 100 {
		t.Fatalf("consumer after update: %v", err)
	}
	// A field removed from the file goes back to the server's default.
	topo.Streams[0].MaxMsgSize = 0
	changed, err = topo.Ensure(ctx, js)
	if want := []string{"stream SMS updated"}; err != nil || !slices.Equal(changed, want) {
		t.Fatalf("Ensure after removing a field = %q, %v; want %q", changed, err, want)
	}
	if s, err = js.Stream(ctx, streams.Stream); err != nil || s.CachedInfo().Config.MaxMsgSize != -1 {
		t.Fatalf("max_msg_size after its removal: %v, %v", s.CachedInfo().Config.MaxMsgSize, err)
	}
	if s.CachedInfo().Config.Metadata[streams.DigestKey] == "" {
		t.Fatal("the applied config's digest is not in the stream's metadata")
	}
	// An operator's edit of a field the file sets is put back.
	edited := s.CachedInfo().Config
	edited.MaxAge = time.Hour
	if _, err := js.UpdateStream(ctx, edited); err != nil {
		t.Fatal(err)
	}
	changed, err = topo.Ensure(ctx, js)
	if want := []string{"stream SMS updated"}; err != nil || !slices.Equal(changed, want) {
		t.Fatalf("Ensure after an operator's edit = %q, %v; want %q", changed, err, want)
	}
	if changed, err := topo.Ensure(ctx, js); err != nil || len(changed) != 0 {
		t.Fatalf("Ensure on a matching server = %q, %v; want no change", changed, err)
	}
}

// Relays and senders start together on a fresh server: every Ensure succeeds,
// the topology is created, and nothing is updated. (Two racers may both see
// their create succeed: the server answers an identical create with the
// existing stream.)
func TestEnsureConcurrentStartUps(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 6
	results := make([][]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		_, js := srv.Connect(t)
		wg.Go(func() { results[i], errs[i] = topo.Ensure(ctx, js) })
	}
	wg.Wait()
	counts := map[string]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Ensure %d: %v", i, errs[i])
		}
		for _, c := range results[i] {
			counts[c]++
		}
	}
	for c := range counts {
		if !strings.HasSuffix(c, " created") {
			t.Errorf("a concurrent start-up did %q", c)
		}
	}
	for _, c := range []string{"stream SMS created", "stream SMS_DLQ created", "consumer SMS/senders created"} {
		if counts[c] == 0 {
			t.Errorf("no start-up reported %q (all: %v)", c, counts)
		}
	}
}

// Each lane's consumer takes exactly its lane's subject; the normal lane's
// also the subject of publications from before lanes.
func TestLanesMatchTheConsumers(t *testing.T) {
	t.Parallel()
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range streams.Lanes {
		c, err := topo.Consumer(streams.Stream, l.Consumer)
		if err != nil {
			t.Fatalf("lane %s: %v", l.Name, err)
		}
		subjects := append([]string{c.FilterSubject}, c.FilterSubjects...)
		if !slices.Contains(subjects, l.Subject) {
			t.Errorf("lane %s: consumer %s filters %q, not %s", l.Name, l.Consumer, subjects, l.Subject)
		}
		if l.Priority == 2 && !slices.Contains(subjects, streams.SubjectSend) {
			t.Errorf("the normal lane does not take %s", streams.SubjectSend)
		}
		if streams.LaneOf(l.Priority) != l {
			t.Errorf("LaneOf(%d) = %+v", l.Priority, streams.LaneOf(l.Priority))
		}
	}
}

// SMS_DLQ used to have no bound and to drop its oldest letters when one
// was set by hand (discard old). The start-up that brings this release's
// file bounds an existing stream in place, discard new, and keeps every
// letter it holds, even more than the new bound (a full stream refuses
// new letters; it never drops stored ones).
func TestEnsureBoundsAnExistingDeadLetterStream(t *testing.T) {
	t.Parallel()
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(topo.Streams, func(c jetstream.StreamConfig) bool { return c.Name == streams.DeadLetterStream })
	want := topo.Streams[i]
	if want.MaxBytes <= 0 || want.Discard != jetstream.DiscardNew {
		t.Fatalf("nats/SMS_DLQ.stream.json: max_bytes %d, discard %s; want a bound and discard new", want.MaxBytes, want.Discard)
	}
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The stream as the previous release made it, holding 40 letters.
	old := want
	old.MaxBytes, old.Discard = -1, jetstream.DiscardOld
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if _, err := js.Publish(ctx, streams.SubjectDeadLetter, []byte(strings.Repeat("l", 200)), jetstream.WithMsgID(fmt.Sprint("dlq:", i))); err != nil {
			t.Fatal(err)
		}
	}
	// Scaled down, so that the 40 letters are over the bound.
	topo.Streams[i].MaxBytes = 4 << 10
	changed, err := topo.Ensure(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(changed, "stream SMS_DLQ updated") {
		t.Fatalf("Ensure = %q; want SMS_DLQ updated", changed)
	}
	s, err := js.Stream(ctx, streams.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	info := s.CachedInfo()
	if info.Config.MaxBytes != 4<<10 || info.Config.Discard != jetstream.DiscardNew {
		t.Fatalf("SMS_DLQ after Ensure: max_bytes %d, discard %s", info.Config.MaxBytes, info.Config.Discard)
	}
	if info.State.Msgs != 40 || info.State.FirstSeq != 1 {
		t.Fatalf("SMS_DLQ after Ensure holds %d letters from %d; want the 40 from 1", info.State.Msgs, info.State.FirstSeq)
	}
	if _, err := js.Publish(ctx, streams.SubjectDeadLetter, []byte("one more"), jetstream.WithMsgID("dlq:40")); err == nil {
		t.Fatal("SMS_DLQ over its bound took a new letter")
	}
}
