package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// The bare baselines: the floor of the relay's and the pipeline's work,
// run in goroutines of the bench on the same Postgres and NATS server as
// the product, so that the product's figures can be read as ratios that
// do not drift with the machine. Their table lives in a schema of its own
// with only a partial index on the pending rows; their stream and subject
// are their own. No leases, fences, attempts log, receipts or metrics.

const (
	// bareSchema and bareTable hold the baselines' outbox.
	bareSchema = "sendonce_bare"
	bareTable  = bareSchema + ".outbox"
	// bareStream, bareSubject and bareConsumer are the baselines' stream,
	// its subject and its durable pull consumer.
	bareStream   = "BARE"
	bareSubject  = "bare.send"
	bareConsumer = "bare"
	// bareBatch is the rows one bare relay batch claims, bareLoops how many
	// batch loops run at once: the relay's defaults.
	bareBatch = 500
	bareLoops = 2
)

// bareDDL creates the baselines' table: the columns a pipeline needs and
// one partial index, for the relay's claim.
const bareDDL = `DROP SCHEMA IF EXISTS ` + bareSchema + ` CASCADE;
CREATE SCHEMA ` + bareSchema + `;
CREATE TABLE ` + bareTable + ` (
	id uuid PRIMARY KEY,
	created_at timestamptz NOT NULL DEFAULT now(),
	status text NOT NULL DEFAULT 'pending',
	phone text NOT NULL,
	body text NOT NULL,
	attempt_count int NOT NULL DEFAULT 0,
	provider_ref text,
	updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_pending ON ` + bareTable + ` (created_at) WHERE status = 'pending';`

// bareMessage is what the bare relay publishes.
type bareMessage struct {
	ID    uuid.UUID `json:"id"`
	Phone string    `json:"phone"`
	Body  string    `json:"body"`
}

// setupBare creates the baselines' schema afresh.
func (b *bench) setupBare(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, bareDDL); err != nil {
		return fmt.Errorf("create %s: %w", bareTable, err)
	}
	return nil
}

// bareRows empties the bare table and writes n pending rows to it with
// COPY, like copyRows for the product's table.
func (b *bench) bareRows(ctx context.Context, n int) error {
	if _, err := b.pool.Exec(ctx, `TRUNCATE `+bareTable); err != nil {
		return fmt.Errorf("empty %s: %w", bareTable, err)
	}
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == n {
			return nil, nil
		}
		i++
		return []any{rowID(), fmt.Sprintf("+1555%07d", i%10_000_000),
			fmt.Sprintf("Your sendonce bench code is %06d. It expires in 10 minutes.", i%1_000_000)}, nil
	})
	if _, err := b.pool.CopyFrom(ctx, pgx.Identifier{bareSchema, "outbox"}, []string{"id", "phone", "body"}, src); err != nil {
		return fmt.Errorf("copy %d rows to %s: %w", n, bareTable, err)
	}
	for _, q := range []string{`ANALYZE ` + bareTable, `CHECKPOINT`} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// barePool opens the baselines' own connections, named so in
// pg_stat_activity.
func (b *bench) barePool(ctx context.Context, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(b.cfg.databaseURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns)
	cfg.ConnConfig.RuntimeParams["application_name"] = "sendonce-bench-bare"
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// bareJetStream creates the baselines' stream (configured like the
// product's: file storage, one replica, a duplicates window) and, when
// consumer is set, its durable pull consumer.
func bareJetStream(ctx context.Context, nc *nats.Conn, consumer bool) (jetstream.JetStream, jetstream.Consumer, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	_ = js.DeleteStream(ctx, bareStream)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: bareStream, Subjects: []string{bareSubject},
		Storage: jetstream.FileStorage, Replicas: 1, Duplicates: 10 * time.Minute, Discard: jetstream.DiscardNew})
	if err != nil {
		return nil, nil, fmt.Errorf("create stream %s: %w", bareStream, err)
	}
	if !consumer {
		return js, nil, nil
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: bareConsumer, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 30 * time.Second, MaxAckPending: 20_000, MaxWaiting: 512})
	if err != nil {
		return nil, nil, fmt.Errorf("create consumer %s: %w", bareConsumer, err)
	}
	return js, c, nil
}

// runBareRelay runs bareLoops batch loops until no pending row is left:
// claim up to bareBatch rows with FOR UPDATE SKIP LOCKED, publish each
// asynchronously with Nats-Msg-Id, wait for every PubAck, mark the rows
// queued in one UPDATE, commit.
func runBareRelay(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream) error {
	g, ctx := errgroup.WithContext(ctx)
	for range bareLoops {
		g.Go(func() error {
			for {
				n, err := bareRelayBatch(ctx, pool, js)
				if err != nil || n == 0 {
					return err
				}
			}
		})
	}
	return g.Wait()
}

func bareRelayBatch(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, `SELECT id, phone, body FROM `+bareTable+`
			WHERE status = 'pending' ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED`, bareBatch)
		msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (bareMessage, error) {
			var m bareMessage
			err := r.Scan(&m.ID, &m.Phone, &m.Body)
			return m, err
		})
		if err != nil || len(msgs) == 0 {
			return err
		}
		futures := make([]jetstream.PubAckFuture, len(msgs))
		ids := make([][16]byte, len(msgs))
		for i, m := range msgs {
			data, _ := json.Marshal(m)
			nm := nats.NewMsg(bareSubject)
			nm.Data = data
			nm.Header.Set(jetstream.MsgIDHeader, m.ID.String())
			if futures[i], err = js.PublishMsgAsync(nm); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			ids[i] = m.ID
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("publish: %w", err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE `+bareTable+` o SET status = 'queued', updated_at = now()
			FROM unnest($1::uuid[]) AS v(id) WHERE o.id = v.id`, ids); err != nil {
			return fmt.Errorf("mark queued: %w", err)
		}
		n = len(msgs)
		return nil
	})
	return n, err
}

// bareSender is the bare pipeline's consumer side: loops that each fetch a
// batch, claim its rows in one UPDATE, post every message to the provider
// at once over kept-alive connections, mark the rows sent in one UPDATE
// and acknowledge the messages.
type bareSender struct {
	pool    *pgxpool.Pool
	cons    jetstream.Consumer
	client  *http.Client
	stubURL string
	apiKey  string
	batch   int
	sent    atomic.Int64
	// callback, when set, is the bare receiver's URL: each message asks
	// the stub for its receipts there.
	callback string
}

func newBareHTTPClient(conns int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = conns
	t.MaxIdleConnsPerHost = conns
	return &http.Client{Timeout: 10 * time.Second, Transport: t}
}

// run runs loops fetch loops until n rows were sent or ctx ends.
func (s *bareSender) run(ctx context.Context, loops, n int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	for range loops {
		g.Go(func() error {
			for s.sent.Load() < int64(n) {
				batch, err := s.cons.Fetch(s.batch, jetstream.FetchMaxWait(20*time.Millisecond))
				if err != nil {
					return fmt.Errorf("fetch: %w", err)
				}
				var msgs []jetstream.Msg
				for m := range batch.Messages() {
					msgs = append(msgs, m)
				}
				if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
					if gctx.Err() != nil {
						return gctx.Err()
					}
					return fmt.Errorf("fetch: %w", err)
				}
				if len(msgs) == 0 {
					if gctx.Err() != nil {
						return gctx.Err()
					}
					continue
				}
				if err := s.handle(gctx, msgs); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// handle claims, sends, records and acknowledges one fetched batch.
func (s *bareSender) handle(ctx context.Context, msgs []jetstream.Msg) error {
	bm := make([]bareMessage, len(msgs))
	ids := make([][16]byte, len(msgs))
	for i, m := range msgs {
		if err := json.Unmarshal(m.Data(), &bm[i]); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		ids[i] = bm[i].ID
	}
	// A message can arrive before its relay batch commits: the claim then
	// waits for the relay's row lock and finds the row queued.
	tag, err := s.pool.Exec(ctx, `UPDATE `+bareTable+` SET status = 'sending', attempt_count = attempt_count + 1, updated_at = now()
		WHERE id = ANY($1::uuid[]) AND status IN ('pending', 'queued')`, ids)
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	if int(tag.RowsAffected()) != len(ids) {
		return fmt.Errorf("claim: %d of %d rows", tag.RowsAffected(), len(ids))
	}
	refs := make([]string, len(msgs))
	var wg sync.WaitGroup
	var errOnce sync.Once
	var postErr error
	for i := range bm {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref, err := s.post(ctx, bm[i])
			if err != nil {
				errOnce.Do(func() { postErr = err })
			}
			refs[i] = ref
		}()
	}
	wg.Wait()
	if postErr != nil {
		return postErr
	}
	// A receipt may have settled a row already (the stub posts it as soon
	// as it accepted): sent never overwrites it.
	if _, err := s.pool.Exec(ctx, `UPDATE `+bareTable+` o SET status = 'sent', provider_ref = v.ref, updated_at = now()
		FROM unnest($1::uuid[], $2::text[]) AS v(id, ref) WHERE o.id = v.id AND o.status = 'sending'`, ids, refs); err != nil {
		return fmt.Errorf("mark sent: %w", err)
	}
	for _, m := range msgs {
		if err := m.Ack(); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
	}
	s.sent.Add(int64(len(msgs)))
	return nil
}

// post sends one message to the stub with its id as Idempotency-Key and
// returns the provider's id.
func (s *bareSender) post(ctx context.Context, m bareMessage) (string, error) {
	fields := map[string]string{"to": m.Phone, "body": m.Body}
	if s.callback != "" {
		fields["reference"], fields["callback_url"] = m.ID.String(), s.callback
	}
	body, _ := json.Marshal(fields)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(s.stubURL, "/")+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.apiKey)
	req.Header.Set("Idempotency-Key", m.ID.String())
	resp, err := s.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("provider: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("provider: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("provider answered %d", resp.StatusCode)
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.ID == "" {
		return "", fmt.Errorf("provider answer without an id (%d bytes)", len(raw))
	}
	return out.ID, nil
}

// bareReceiver is the bare pipeline's receiver: each receipt the stub posts
// that settles a message (delivered, undelivered) is one UPDATE of its row
// by id, committed on its own, and answered 204 once it is. No signature
// check, no evidence, no forward-only guard: the floor of taking a receipt.
func bareReceiver(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rc struct {
			Reference string `json:"reference"`
			Status    string `json:"status"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&rc); err != nil {
			http.Error(w, "bad receipt", http.StatusBadRequest)
			return
		}
		if rc.Status == "delivered" || rc.Status == "undelivered" {
			if _, err := pool.Exec(r.Context(), `UPDATE `+bareTable+` SET status = $2, updated_at = now() WHERE id = $1`, rc.Reference, rc.Status); err != nil {
				http.Error(w, "not written", http.StatusServiceUnavailable)
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
}
