// Package streams provides the JetStream topology of sendonce: the work stream,
// the dead-letter stream and the senders' durable consumer, read from the JSON
// files in nats/ so that what runs is what is reviewed.
package streams

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"reflect"
	"sort"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce"
)

// Names every component agrees on (docs/design.md, "Subjects, streams and
// messages").
const (
	// Stream is the work stream the relay publishes to.
	Stream = "SMS"
	// SubjectSend is the subject of one outbox row publication.
	SubjectSend = "sms.send"
	// DeadLetterStream stores dead letters.
	DeadLetterStream = "SMS_DLQ"
	// SubjectDeadLetter is the subject of dead letters.
	SubjectDeadLetter = "sms.dlq"
	// Consumer is the durable pull consumer shared by every sender: the
	// normal lane (it also takes sms.send, the subject of publications
	// from before lanes).
	Consumer = "senders"
	// ConsumerUrgent and ConsumerBulk are the urgent and bulk lanes'.
	ConsumerUrgent = "senders_urgent"
	ConsumerBulk   = "senders_bulk"
)

// Lane is one priority's share of the work stream: the subject the relay
// publishes its rows to and the durable consumer the senders pull it from.
type Lane struct {
	// Priority is 1 (urgent), 2 (normal) or 3 (bulk).
	Priority int
	// Name is "urgent", "normal" or "bulk" (a metric label).
	Name string
	// Subject is sms.send.<priority>.
	Subject string
	// Consumer is the lane's durable pull consumer.
	Consumer string
}

// Lanes are the priority lanes, most urgent first.
var Lanes = []Lane{
	{Priority: 1, Name: "urgent", Subject: SubjectSend + ".1", Consumer: ConsumerUrgent},
	{Priority: 2, Name: "normal", Subject: SubjectSend + ".2", Consumer: Consumer},
	{Priority: 3, Name: "bulk", Subject: SubjectSend + ".3", Consumer: ConsumerBulk},
}

// LaneOf returns the lane of priority p; anything but 1 and 3 is normal.
func LaneOf(p int) Lane {
	switch p {
	case 1:
		return Lanes[0]
	case 3:
		return Lanes[2]
	}
	return Lanes[1]
}

// Topology is the set of streams and consumers that sendonce needs.
type Topology struct {
	// Streams in file name order.
	Streams []jetstream.StreamConfig
	// Consumers maps a stream name to its consumers' configs.
	Consumers map[string][]jetstream.ConsumerConfig
}

// Load reads a topology from fsys: files named STREAM.stream.json hold a
// stream config, files named STREAM.NAME.consumer.json a consumer config of
// that stream. Unknown JSON fields are refused, so that a typo in a setting
// does not silently fall back to a default.
func Load(fsys fs.FS, dir string) (*Topology, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read nats config dir: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)

	t := &Topology{Consumers: map[string][]jetstream.ConsumerConfig{}}
	for _, name := range names {
		p := path.Join(dir, name)
		switch {
		case strings.HasSuffix(name, ".stream.json"):
			var cfg jetstream.StreamConfig
			if err := decodeFile(fsys, p, &cfg); err != nil {
				return nil, err
			}
			if want := strings.TrimSuffix(name, ".stream.json"); cfg.Name != want {
				return nil, fmt.Errorf("%s: stream name %q does not match the file name", p, cfg.Name)
			}
			t.Streams = append(t.Streams, cfg)
		case strings.HasSuffix(name, ".consumer.json"):
			stream, durable, ok := strings.Cut(strings.TrimSuffix(name, ".consumer.json"), ".")
			if !ok {
				return nil, fmt.Errorf("%s: consumer files are named STREAM.NAME.consumer.json", p)
			}
			var cfg jetstream.ConsumerConfig
			if err := decodeFile(fsys, p, &cfg); err != nil {
				return nil, err
			}
			if cfg.Durable != durable {
				return nil, fmt.Errorf("%s: durable_name %q does not match the file name", p, cfg.Durable)
			}
			if err := validateConsumer(cfg); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			t.Consumers[stream] = append(t.Consumers[stream], cfg)
		}
	}
	for stream := range t.Consumers {
		if _, err := t.Stream(stream); err != nil {
			return nil, fmt.Errorf("consumer config for unknown stream: %w", err)
		}
	}
	return t, nil
}

// Default returns the topology embedded from the repository's nats/ directory.
func Default() (*Topology, error) {
	return Load(sendonce.NATSConfig, "nats")
}

// Stream returns the config of the named stream.
func (t *Topology) Stream(name string) (jetstream.StreamConfig, error) {
	for _, s := range t.Streams {
		if s.Name == name {
			return s, nil
		}
	}
	return jetstream.StreamConfig{}, fmt.Errorf("stream %q is not defined", name)
}

// Consumer returns the config of the named consumer of stream.
func (t *Topology) Consumer(stream, name string) (jetstream.ConsumerConfig, error) {
	for _, c := range t.Consumers[stream] {
		if c.Durable == name {
			return c, nil
		}
	}
	return jetstream.ConsumerConfig{}, fmt.Errorf("consumer %q of stream %q is not defined", name, stream)
}

// Ensure creates every stream and consumer of t that is missing and updates
// those whose server config differs from a field t declares, so that a fresh
// NATS server needs no manual step. It returns what it created or updated,
// one "stream NAME" or "consumer STREAM/NAME" each with the verb; nothing
// when the server already matches. It is idempotent, and safe when several
// processes run it at once.
//
// It sends no update that would not change anything: nats-server 2.15.2 rewrites
// the stream's store config on every update, even an identical one, without
// the lock a concurrent consumer create reads it under (the race detector
// caught it when a relay and two senders started together).
func (t *Topology) Ensure(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	var changed []string
	for _, cfg := range t.Streams {
		what, err := ensureStream(ctx, js, cfg)
		if err != nil {
			return changed, fmt.Errorf("stream %s: %w", cfg.Name, err)
		}
		if what != "" {
			changed = append(changed, "stream "+cfg.Name+" "+what)
		}
	}
	streamNames := make([]string, 0, len(t.Consumers))
	for s := range t.Consumers {
		streamNames = append(streamNames, s)
	}
	sort.Strings(streamNames)
	for _, s := range streamNames {
		for _, cfg := range t.Consumers[s] {
			what, err := ensureConsumer(ctx, js, s, cfg)
			if err != nil {
				return changed, fmt.Errorf("consumer %s on stream %s: %w", cfg.Durable, s, err)
			}
			if what != "" {
				changed = append(changed, "consumer "+s+"/"+cfg.Durable+" "+what)
			}
		}
	}
	return changed, nil
}

// ensureStream returns "created", "updated", a note when the server keeps
// more replicas than cfg asks for, or "" when the server matched.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (string, error) {
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		d, err := digest(cfg)
		if err != nil {
			return "", err
		}
		create := cfg
		create.Metadata = stamped(cfg.Metadata, d)
		if _, err = js.CreateStream(ctx, create); err == nil {
			return "created", nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return "", fmt.Errorf("create: %w", replicasHint(err, cfg.Replicas))
		}
		// Another process created it first, maybe from another config.
		s, err = js.Stream(ctx, cfg.Name)
	}
	if err != nil {
		return "", fmt.Errorf("look up: %w", err)
	}
	have := s.CachedInfo().Config
	note := ""
	if want := max(cfg.Replicas, 1); have.Replicas > want {
		// Never scale down: a process started without NATS_REPLICAS next
		// to others started with it would take the cluster's redundancy
		// away, and the next one would put it back.
		note = fmt.Sprintf("kept at %d replicas (NATS_REPLICAS=%d never scales down)", have.Replicas, want)
		cfg.Replicas = have.Replicas
	}
	d, err := digest(cfg)
	if err != nil {
		return "", err
	}
	cfg.Metadata = stamped(cfg.Metadata, d)
	same, err := declaredMatch(cfg, have)
	if err != nil || same {
		return note, err
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return "", fmt.Errorf("update: %w", replicasHint(err, cfg.Replicas))
	}
	if have.Replicas != cfg.Replicas {
		return fmt.Sprintf("updated (replicas %d -> %d)", max(have.Replicas, 1), cfg.Replicas), nil
	}
	return "updated", nil
}

// ensureConsumer is ensureStream for a consumer.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (string, error) {
	c, err := js.Consumer(ctx, stream, cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		d, err := digest(cfg)
		if err != nil {
			return "", err
		}
		create := cfg
		create.Metadata = stamped(cfg.Metadata, d)
		if _, err = js.CreateConsumer(ctx, stream, create); err == nil {
			return "created", nil
		}
		if !errors.Is(err, jetstream.ErrConsumerExists) {
			return "", fmt.Errorf("create: %w", replicasHint(err, cfg.Replicas))
		}
		c, err = js.Consumer(ctx, stream, cfg.Durable)
	}
	if err != nil {
		return "", fmt.Errorf("look up: %w", err)
	}
	have := c.CachedInfo().Config
	note := ""
	if have.Replicas > cfg.Replicas && cfg.Replicas > 0 {
		note = fmt.Sprintf("kept at %d replicas (NATS_REPLICAS=%d never scales down)", have.Replicas, cfg.Replicas)
		cfg.Replicas = have.Replicas
	} else if cfg.Replicas == 0 && have.Replicas > 1 {
		// 0 follows the stream; a consumer set to more by an earlier
		// NATS_REPLICAS keeps them, as its stream does.
		cfg.Replicas = have.Replicas
	}
	d, err := digest(cfg)
	if err != nil {
		return "", err
	}
	cfg.Metadata = stamped(cfg.Metadata, d)
	same, err := declaredMatch(cfg, have)
	if err != nil || same {
		return note, err
	}
	if _, err := js.UpdateConsumer(ctx, stream, cfg); err != nil {
		return "", fmt.Errorf("update: %w", replicasHint(err, cfg.Replicas))
	}
	if have.Replicas != cfg.Replicas {
		return fmt.Sprintf("updated (replicas %d -> %d)", have.Replicas, cfg.Replicas), nil
	}
	return "updated", nil
}

// DigestKey is the metadata key under which Ensure records a digest of the
// config it applied: a field removed from a nats/ file (back to the server's
// default) changes the digest, which the field comparison alone would miss.
const DigestKey = "sendonce_config_sha256"

func digest(cfg any) (string, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12]), nil
}

// stamped returns a copy of md with the digest added.
func stamped(md map[string]string, digest string) map[string]string {
	out := maps.Clone(md)
	if out == nil {
		out = make(map[string]string, 1)
	}
	out[DigestKey] = digest
	return out
}

// declaredMatch reports whether every field that want sets in its JSON form
// has the same value in have. Keys the server adds (defaults it fills in,
// metadata of its own) are not compared; the digest in want's metadata
// stands for the fields want leaves out.
func declaredMatch(want, have any) (bool, error) {
	var w, h map[string]any
	for _, x := range []struct {
		v   any
		dst *map[string]any
	}{{want, &w}, {have, &h}} {
		b, err := json.Marshal(x.v)
		if err != nil {
			return false, err
		}
		if err := json.Unmarshal(b, x.dst); err != nil {
			return false, err
		}
	}
	return subset(w, h), nil
}

func subset(want, have any) bool {
	wm, ok := want.(map[string]any)
	if !ok {
		return reflect.DeepEqual(want, have)
	}
	hm, ok := have.(map[string]any)
	if !ok {
		return false
	}
	for k, v := range wm {
		if !subset(v, hm[k]) {
			return false
		}
	}
	return true
}

// Check reports an error unless every stream of t exists; it serves readiness
// probes.
func (t *Topology) Check(ctx context.Context, js jetstream.JetStream) error {
	for _, cfg := range t.Streams {
		if _, err := js.Stream(ctx, cfg.Name); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("stream %s is missing", cfg.Name)
			}
			return fmt.Errorf("look up stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// validateConsumer refuses settings the server would reject or that break
// the senders' assumptions, naming the setting.
func validateConsumer(c jetstream.ConsumerConfig) error {
	switch {
	case c.AckPolicy != jetstream.AckExplicitPolicy:
		return errors.New("ack_policy must be explicit: a message is acked only after its status is written")
	case c.MaxDeliver != -1 && c.MaxDeliver < 1:
		return fmt.Errorf("max_deliver %d must be -1 or at least 1", c.MaxDeliver)
	case len(c.BackOff) > 0 && c.MaxDeliver != -1 && c.MaxDeliver < len(c.BackOff):
		return fmt.Errorf("max_deliver %d is below the %d steps of backoff", c.MaxDeliver, len(c.BackOff))
	case c.AckWait < 0:
		return fmt.Errorf("ack_wait %s is negative", c.AckWait)
	case len(c.BackOff) > 0 && c.AckWait != 0 && c.AckWait != c.BackOff[0]:
		// The server replaces ack_wait by backoff[0]: the file would never
		// match the server, and every start-up would update the consumer.
		return fmt.Errorf("ack_wait %s must be left out or equal backoff[0] %s: the server uses backoff[0]", c.AckWait, c.BackOff[0])
	}
	for i, d := range c.BackOff {
		if d <= 0 {
			return fmt.Errorf("backoff[%d] %s must be positive", i, d)
		}
	}
	return nil
}

func decodeFile(fsys fs.FS, p string, v any) error {
	f, err := fsys.Open(p)
	if err != nil {
		return fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode %s: %w", p, err)
	}
	return nil
}
