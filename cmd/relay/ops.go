package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/wire"
)

const opsUsage = `operator commands:
  relay dlq list   [-reason R] [-since T] [-limit N] [-after SEQ]
                                                          list dead letters, a page at a time
  relay dlq replay -id ID [-dry-run] [-force]             put a dead or unknown row back to pending
  relay dlq replay -reason R (-since T | -limit N) [-after SEQ] [-batch B] [-rate R/s] [-dry-run] [-force]
                                                          ... the rows of matching letters, in batches
  relay trace ID                                          a row, its attempts, receipts, lookups and dead letters
T is an RFC 3339 time or a duration back from now (24h). R is permanent,
max_attempts, ambiguous or invalid. A list shows -limit letters (default 100)
and the -after SEQ of the next page. A replay by reason needs -since or
-limit; it commits -batch rows per transaction (default 100) at -rate rows a
second at most (default 100). A letter replays its row only while the row is
still in the state the letter describes (same generation and reason). Only
with -force: a row with evidence that the provider may have its message (a
receipt, or a lookup that found it), and an unknown row unless its letter
records a provider that honours idempotency keys.`

// Bounds of the operator commands' pages and batches.
const (
	defaultListLimit   = 100
	maxListLimit       = 10000
	defaultReplayBatch = 100
	maxReplayBatch     = 1000
	defaultReplayRate  = 100.0
	traceLetterLimit   = 100
)

type opsConfig struct {
	db                service.Database
	nats              natsconn.Config
	reason, since, id string
	dryRun, force     bool
	limit, batch      int
	after             uint64
	rate              float64
}

func runOps(ctx context.Context, cmd string, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	verb := ""
	if cmd == "dlq" {
		if len(args) == 0 || strings.HasPrefix(args[0], "-") {
			fmt.Fprintln(stderr, opsUsage)
			return 2
		}
		verb, args = args[0], args[1:]
		if verb != "list" && verb != "replay" {
			fmt.Fprintf(stderr, "relay dlq: unknown command %q\n%s\n", verb, opsUsage)
			return 2
		}
	}
	var c opsConfig
	s := envflag.New("relay "+strings.TrimSpace(cmd+" "+verb), getenv, stderr)
	service.BindDatabase(s, &c.db)
	natsconn.Bind(s, &c.nats)
	fs := s.FlagSet()
	if cmd == "dlq" {
		fs.StringVar(&c.reason, "reason", "", "only dead letters with this reason")
		fs.StringVar(&c.since, "since", "", "only dead letters since this time (RFC 3339) or for this long (24h)")
		fs.Uint64Var(&c.after, "after", 0, "only dead letters stored after this sequence (the cursor a list prints for its next page)")
	}
	if verb == "list" {
		fs.IntVar(&c.limit, "limit", defaultListLimit, fmt.Sprintf("letters on a page (at most %d)", maxListLimit))
	}
	if verb == "replay" {
		fs.StringVar(&c.id, "id", "", "replay this row")
		fs.BoolVar(&c.dryRun, "dry-run", false, "show what would be replayed, change nothing")
		fs.BoolVar(&c.force, "force", false, "also replay rows with evidence that the provider may have the message (a receipt, a lookup that found it) and unknown rows whose provider may not honour idempotency keys (the user may get the message twice)")
		fs.IntVar(&c.limit, "limit", 0, "replay by reason: read at most this many matching letters (0: all since -since)")
		fs.IntVar(&c.batch, "batch", defaultReplayBatch, fmt.Sprintf("replay by reason: rows per transaction (at most %d)", maxReplayBatch))
		fs.Float64Var(&c.rate, "rate", defaultReplayRate, "replay by reason: rows a second at most")
	}
	if err := s.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, opsUsage)
			return 0
		}
		fmt.Fprintf(stderr, "relay %s: %v\n", cmd, err)
		return 2
	}
	var err error
	switch {
	case cmd == "trace":
		if fs.NArg() != 1 {
			fmt.Fprintf(stderr, "relay trace: want one row id\n%s\n", opsUsage)
			return 2
		}
		err = trace(ctx, c, fs.Arg(0), stdout)
	case verb == "list":
		err = dlqList(ctx, c, stdout)
	case verb == "replay":
		err = dlqReplay(ctx, c, stdout)
	}
	var usage usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(stderr, "relay %s: %v\n", cmd, err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

type usageError struct{ error }

func (c opsConfig) filter() (deadletter.Filter, error) {
	f := deadletter.Filter{Reason: c.reason}
	switch c.reason {
	case "", wire.ReasonPermanent, wire.ReasonMaxAttempts, wire.ReasonAmbiguous, wire.ReasonInvalid:
	default:
		return f, usageError{fmt.Errorf("-reason %q: want permanent, max_attempts, ambiguous or invalid", c.reason)}
	}
	if c.since != "" {
		if d, err := time.ParseDuration(c.since); err == nil && d > 0 {
			f.Since = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, c.since); err == nil {
			f.Since = t
		} else {
			return f, usageError{fmt.Errorf("-since %q: want an RFC 3339 time or a positive duration", c.since)}
		}
	}
	return f, nil
}

// withLetters connects to NATS and runs fn with the JetStream to read the
// dead letters from; each read of fn is bounded by a minute.
func withLetters(c opsConfig, fn func(js jetstream.JetStream) error) error {
	nc, js, err := natsconn.Connect(withConn(c.nats, "sendonce-relay-ops", 0, nil))
	if err != nil {
		return err
	}
	defer nc.Close()
	return fn(js)
}

// scanLetters calls fn with each letter matching f after sequence after,
// holding one fetch of letters at a time.
func scanLetters(ctx context.Context, js jetstream.JetStream, f deadletter.Filter, after uint64, fn func(deadletter.Letter) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return deadletter.Scan(ctx, js, "", f, after, fn)
}

func dlqList(ctx context.Context, c opsConfig, out io.Writer) error {
	f, err := c.filter()
	if err != nil {
		return err
	}
	if c.limit <= 0 || c.limit > maxListLimit {
		return usageError{fmt.Errorf("-limit %d: want 1 to %d", c.limit, maxListLimit)}
	}
	var (
		letters []deadletter.Letter
		next    uint64
	)
	err = withLetters(c, func(js jetstream.JetStream) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		letters, next, err = deadletter.Page(ctx, js, "", f, c.after, c.limit)
		return err
	})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tOUTBOX ID\tREASON\tATTEMPTS\tCODE\tERROR")
	for _, l := range letters {
		id := "-"
		if l.OutboxID != uuid.Nil {
			id = l.OutboxID.String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\n", l.Seq, l.Time.UTC().Format(time.RFC3339), id, l.Reason, l.Attempts, l.ProviderCode, l.Error)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d dead letters\n", len(letters))
	if next != 0 {
		fmt.Fprintf(out, "more: the next page is -after %d\n", next)
	}
	return nil
}

func dlqReplay(ctx context.Context, c opsConfig, out io.Writer) error {
	switch {
	case c.id != "" && (c.reason != "" || c.since != "" || c.limit != 0 || c.after != 0):
		return usageError{errors.New("give -id or -reason with -since/-limit, not both")}
	case c.id != "":
		return replayOne(ctx, c, out)
	case c.reason != "":
		return replayByReason(ctx, c, out)
	default:
		return usageError{errors.New("give -id ID or -reason R")}
	}
}

func replayOne(ctx context.Context, c opsConfig, out io.Writer) error {
	id, err := uuid.Parse(c.id)
	if err != nil {
		return usageError{fmt.Errorf("-id %q is not a UUID", c.id)}
	}
	// The row's newest letter says whether its provider honours keys.
	t := outbox.ReplayTarget{ID: id}
	err = withLetters(c, func(js jetstream.JetStream) error {
		return scanLetters(ctx, js, deadletter.Filter{OutboxID: id}, 0, func(l deadletter.Letter) (bool, error) {
			lt := l.ReplayTarget()
			t.SafeUnknown, t.Elsewhere = lt.SafeUnknown, lt.Elsewhere
			return true, nil
		})
	})
	if err != nil {
		return err
	}
	conn, err := service.Connect(ctx, c.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var tally replayTally
	if err := tally.replay(ctx, conn, c, []outbox.ReplayTarget{t}, out); err != nil {
		return err
	}
	tally.summary(c, out)
	if tally.refused > 0 {
		return errors.New("the row was not replayed")
	}
	return nil
}

// replayByReason replays the rows of the letters matching -reason (and
// -since), a page of -batch letters at a time, each page's rows in a
// transaction of their own, at -rate rows a second at most: a large replay
// never locks every row at once, nor floods the sender.
func replayByReason(ctx context.Context, c opsConfig, out io.Writer) error {
	f, err := c.filter()
	if err != nil {
		return err
	}
	switch {
	case c.since == "" && c.limit == 0:
		return usageError{errors.New("a replay by -reason needs -since T or -limit N: it would otherwise replay the whole dead-letter stream")}
	case c.limit < 0:
		return usageError{fmt.Errorf("-limit %d: want a positive count", c.limit)}
	case c.batch <= 0 || c.batch > maxReplayBatch:
		return usageError{fmt.Errorf("-batch %d: want 1 to %d", c.batch, maxReplayBatch)}
	case !(c.rate > 0) || math.IsInf(c.rate, 0):
		return usageError{fmt.Errorf("-rate %v: want a positive number of rows a second", c.rate)}
	}
	conn, err := service.Connect(ctx, c.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var tally replayTally
	cursor, read := c.after, 0
	start := time.Now()
	err = withLetters(c, func(js jetstream.JetStream) error {
		// Only the letters stored before the replay began: a row replayed
		// here that dies again must not be replayed again by its new letter.
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		f.Through, err = deadletter.LastSeq(rctx, js, "")
		cancel()
		if err != nil || f.Through == 0 {
			return err
		}
		done := map[uuid.UUID]bool{} // rows this run replayed
		for {
			size := c.batch
			if c.limit > 0 {
				size = min(size, c.limit-read)
			}
			if size == 0 {
				break
			}
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			letters, next, err := deadletter.Page(rctx, js, "", f, cursor, size)
			cancel()
			if err != nil {
				return err
			}
			read += len(letters)
			// Each letter replays its row only if the row is still in the
			// state the letter describes: a letter from before an earlier
			// replay, or of another reason, replays nothing.
			var targets []outbox.ReplayTarget
			for _, l := range letters {
				if l.OutboxID != uuid.Nil && !done[l.OutboxID] {
					targets = append(targets, l.ReplayTarget())
				}
			}
			if len(targets) > 0 {
				replayed, err := tally.replayBatch(ctx, conn, c, targets, out)
				if err != nil {
					return err
				}
				for _, id := range replayed {
					done[id] = true
				}
			}
			if next == 0 {
				cursor = 0
				break
			}
			cursor = next
			// Pace: the rows so far take at least rows/rate seconds.
			if wait := time.Duration(float64(tally.rows)/c.rate*float64(time.Second)) - time.Since(start); wait > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(wait):
				}
			}
		}
		return nil
	})
	if err != nil {
		// What committed stays committed: say how far the replay got.
		tally.summary(c, out)
		if cursor != 0 {
			fmt.Fprintf(out, "stopped: resume with -after %d\n", cursor)
		}
		return err
	}
	tally.summary(c, out)
	if cursor != 0 {
		fmt.Fprintf(out, "more letters match: the next are -after %d\n", cursor)
	}
	return nil
}

// replayTally counts what a replay did.
type replayTally struct {
	rows, replayed, refused, needForce int
	// evidence counts the rows refused for evidence that the provider may
	// have their message (needForce the others refused for want of -force).
	evidence int
	// transactions is the number of transactions committed (or, in a
	// dry run, rolled back).
	transactions int
}

// replayBatch replays targets in one transaction and returns the rows it
// replayed.
func (t *replayTally) replayBatch(ctx context.Context, conn *pgx.Conn, c opsConfig, targets []outbox.ReplayTarget, out io.Writer) ([]uuid.UUID, error) {
	var results []outbox.ReplayResult
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		results, err = outbox.Replay(ctx, tx, targets, outbox.ReplayOptions{DryRun: c.dryRun, Force: c.force})
		return err
	})
	if err != nil {
		return nil, err
	}
	t.transactions++
	verb := "replayed"
	if c.dryRun {
		verb = "would replay"
	}
	var replayed []uuid.UUID
	for _, r := range results {
		t.rows++
		switch {
		case r.Replayed && r.Evidence != "":
			t.replayed++
			replayed = append(replayed, r.ID)
			fmt.Fprintf(out, "%s  %s (was %s; forced, though the provider may have it: %s; the user may get it twice; publish generation %d, same idempotency key)\n",
				r.ID, verb, r.Status, r.Evidence, r.Gen)
		case r.Replayed && r.Status == outbox.StatusUnknown:
			t.replayed++
			replayed = append(replayed, r.ID)
			fmt.Fprintf(out, "%s  %s (was unknown: if the provider took it, the user may get it twice; publish generation %d, same idempotency key)\n", r.ID, verb, r.Gen)
		case r.Replayed:
			t.replayed++
			replayed = append(replayed, r.ID)
			fmt.Fprintf(out, "%s  %s (was %s; publish generation %d, same idempotency key)\n", r.ID, verb, r.Status, r.Gen)
		default:
			t.refused++
			switch {
			case r.NeedsForce && r.Evidence != "":
				t.evidence++
			case r.NeedsForce:
				t.needForce++
			}
			fmt.Fprintf(out, "%s  refused: %s\n", r.ID, r.Refused)
		}
	}
	return replayed, nil
}

func (t *replayTally) replay(ctx context.Context, conn *pgx.Conn, c opsConfig, targets []outbox.ReplayTarget, out io.Writer) error {
	_, err := t.replayBatch(ctx, conn, c, targets, out)
	return err
}

func (t *replayTally) summary(c opsConfig, out io.Writer) {
	verb := "replayed"
	if c.dryRun {
		verb = "would replay"
	}
	fmt.Fprintf(out, "%d %s, %d refused (%d transactions)\n", t.replayed, verb, t.refused, t.transactions)
	if t.evidence > 0 {
		fmt.Fprintf(out, "%d rows need -force: a receipt or a lookup says the provider may have the message, so a replay may send it again; check them with relay trace first\n", t.evidence)
	}
	if t.needForce > 0 {
		fmt.Fprintf(out, "%d unknown rows need -force: their provider may not honour idempotency keys, so a replay may send them twice; check them with relay trace first\n", t.needForce)
	}
}

func trace(ctx context.Context, c opsConfig, arg string, out io.Writer) error {
	id, err := uuid.Parse(arg)
	if err != nil {
		return usageError{fmt.Errorf("%q is not a UUID", arg)}
	}
	conn, err := service.Connect(ctx, c.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	row, err := outbox.GetRow(ctx, conn, id)
	if err != nil {
		return err
	}
	attempts, err := outbox.Attempts(ctx, conn, id)
	if err != nil {
		return err
	}
	seq := "-"
	if row.StreamSeq != nil {
		seq = fmt.Sprint(*row.StreamSeq)
	}
	fmt.Fprintf(out, "row %s\n  status        %s\n  to            %s\n  body          %d characters\n  attempts      %d of %d\n  publish gen   %d (stream seq %s)\n  provider ref  %s\n  last error    %s\n  created       %s\n  updated       %s\n  next attempt  %s\n",
		row.ID, row.Status, row.ToMasked, row.BodyChars, row.Attempts, row.MaxAttempts, row.Gen, seq,
		dash(row.ProviderRef), dash(row.LastError), ts(row.CreatedAt), ts(row.UpdatedAt), ts(row.NextAttemptAt))
	if row.Provider != "" {
		fmt.Fprintf(out, "  provider      %s\n", row.Provider)
	}
	if row.SendAt != nil {
		fmt.Fprintf(out, "  send at       %s (no call before it)\n", ts(*row.SendAt))
	}
	if row.ExpiresAt != nil {
		fmt.Fprintf(out, "  expires at    %s (no call at or after it)\n", ts(*row.ExpiresAt))
	}
	if row.MaybeAccepted {
		fmt.Fprintln(out, "  maybe taken   yes: an attempt may have reached the provider (a lost answer, a 5xx, or a sender that died mid-call)")
	}
	sup, err := outbox.SuppressionOf(ctx, conn, id)
	if err != nil {
		return err
	}
	switch {
	case sup != nil && row.Status == outbox.StatusSuppressed:
		fmt.Fprintf(out, "  suppressed    never sent: the number is on the suppression list (%s)\n", sup.Describe())
	case sup != nil:
		fmt.Fprintf(out, "  suppressed    the number is on the suppression list (%s): no call is made for it\n", sup.Describe())
	case row.Status == outbox.StatusSuppressed:
		fmt.Fprintln(out, "  suppressed    never sent: the number was on the suppression list when the row was claimed (it has been removed since: relay suppress check)")
	}
	if row.LookupPending {
		fmt.Fprintf(out, "  lookup        pending: the provider is asked about the last attempt before anything else (%d lookups failed)\n", row.Lookups)
	}
	if !row.LeaseUntil.IsZero() && (row.Status == outbox.StatusSending || row.Status == outbox.StatusQueued) {
		fmt.Fprintf(out, "  lease until   %s\n", ts(row.LeaseUntil))
	}
	if row.EndReason != "" {
		letter := "not stored yet (the reconciler publishes it)"
		if row.LetterSeq != nil {
			letter = fmt.Sprintf("stored (seq %d)", *row.LetterSeq)
		}
		fmt.Fprintf(out, "  end reason    %s; dead letter %s\n", row.EndReason, letter)
	}

	fmt.Fprintf(out, "in short      %s\n", headline(row))
	fmt.Fprintf(out, "attempts (%d): each a provider request (or a lookup), oldest first\n", len(attempts))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tWHEN\tPROVIDER\tANSWER\tTOOK\tDECIDED\tSENDER\tERROR")
	for _, a := range attempts {
		if a.FromRow {
			// The row's own record of a first attempt that was sent: the
			// time its acceptance was written, no call details.
			fmt.Fprintf(tw, "  %d\t%s\t%s\tnot logged\t-\t%s (a first attempt that is sent is recorded in the row only)\t-\t-\n",
				a.Number, ts(a.StartedAt), dash(a.Provider), decided(a.Outcome))
			continue
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Number, ts(a.StartedAt), dash(a.Provider), answer(a.HTTPStatus, a.ProviderCode),
			a.Latency.Round(time.Millisecond), decided(a.Outcome), dash(a.Sender), dash(a.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	evidence, err := outbox.EvidenceOf(ctx, conn, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "receipts and lookups (%d)\n", len(evidence))
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  RECEIVED\tKIND\tRESULT\tSOURCE\tPROVIDER REF\tCODE\tREPORTED\tDETAIL")
	for _, e := range evidence {
		reported := "-"
		if !e.ReportedAt.IsZero() {
			reported = ts(e.ReportedAt)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", ts(e.ReceivedAt), e.Kind, e.Result, e.Source, dash(e.ProviderRef),
			e.Code, reported, dash(e.Detail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The row's letters: one per publish generation that ended, read a
	// fetch at a time; a row replayed over and over shows its first
	// traceLetterLimit.
	var letters []deadletter.Letter
	more := false
	err = withLetters(c, func(js jetstream.JetStream) error {
		f := deadletter.Filter{OutboxID: id, Since: row.CreatedAt.Add(-time.Minute)}
		return scanLetters(ctx, js, f, 0, func(l deadletter.Letter) (bool, error) {
			if len(letters) == traceLetterLimit {
				more = true
				return false, nil
			}
			letters = append(letters, l)
			return true, nil
		})
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "dead letters (%d)\n", len(letters))
	for _, l := range letters {
		fmt.Fprintf(out, "  seq %d  %s  reason %s  attempts %d  code %d  gen %d  %s\n", l.Seq, ts(l.Time), l.Reason, l.Attempts, l.ProviderCode, l.Gen, l.Error)
	}
	if more {
		fmt.Fprintf(out, "  more: the first %d are shown\n", traceLetterLimit)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ts(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// decided says in words what an attempt's outcome made of the message.
func decided(outcome string) string {
	switch outcome {
	case "sent":
		return "the provider took it"
	case "retry":
		return "failed: tried again later"
	case "rate_limited":
		return "refused for the rate (429): tried again, the attempt given back"
	case "lookup":
		return "asked the provider what it has, before sending again"
	case "permanent":
		return "refused for good: not tried again"
	case "ambiguous":
		return "no answer: the provider may have it"
	case "max_attempts":
		return "failed, and no attempt was left"
	case "expired":
		return "past its expiry: not sent"
	}
	return outcome
}

// answer is what the provider answered a request: its HTTP status and
// error code, or that no answer came.
func answer(status, code int) string {
	switch {
	case status == 0:
		return "no answer"
	case code != 0:
		return fmt.Sprintf("HTTP %d, code %d", status, code)
	}
	return fmt.Sprintf("HTTP %d", status)
}

// headline says in one sentence where the message stands and what, if
// anything, a person may do.
func headline(r outbox.Row) string {
	switch r.Status {
	case outbox.StatusPending, outbox.StatusQueued:
		return fmt.Sprintf("not sent yet (%s): the next attempt is due %s", r.Status, ts(r.NextAttemptAt))
	case outbox.StatusScheduled:
		return "scheduled: nothing is sent before its send time"
	case outbox.StatusSending:
		return "a sender is calling the provider now"
	case outbox.StatusSent:
		return "sent: the provider took it" + ref(r.ProviderRef) + "; no delivery receipt yet"
	case outbox.StatusDelivered:
		return "delivered: the provider reported it reached the phone" + ref(r.ProviderRef)
	case outbox.StatusUndelivered:
		return "undelivered: the provider took it" + ref(r.ProviderRef) + " and reported it did not reach the phone"
	case outbox.StatusDead:
		return "not sent, and it will not be: no provider took it (" + r.EndReason + "); relay dlq replay -id " + r.ID.String() + " sends it again"
	case outbox.StatusUnknown:
		return "unknown: an attempt may have reached the provider and nothing settled it; relay resolve -id " + r.ID.String() + " asks the provider"
	case outbox.StatusExpired:
		return "expired: its expiry came before any call, and it was not sent"
	case outbox.StatusCancelled:
		return "cancelled before any call: not sent"
	case outbox.StatusSuppressed:
		return "not sent: its number is on the suppression list"
	}
	return string(r.Status)
}

func ref(providerRef string) string {
	if providerRef == "" {
		return ""
	}
	return " (its id there: " + providerRef + ")"
}
