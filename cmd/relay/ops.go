package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/wire"
)

const opsUsage = `operator commands:
  relay dlq list   [-reason R] [-since T]                 list dead letters
  relay dlq replay (-id ID | -reason R [-since T]) [-dry-run] [-force]
                                                          put dead or unknown rows back to pending
  relay trace ID                                          a row, its attempts, receipts, lookups and dead letters
T is an RFC 3339 time or a duration back from now (24h). R is permanent,
max_attempts, ambiguous or invalid. A letter replays its row only while the
row is still in the state the letter describes (same generation and reason);
an unknown row is replayed only with -force unless its letter records a
provider that honours idempotency keys.`

type opsConfig struct {
	databaseURL       string
	nats              natsconn.Config
	reason, since, id string
	dryRun, force     bool
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
	service.BindDatabase(s, &c.databaseURL)
	natsconn.Bind(s, &c.nats)
	fs := s.FlagSet()
	if cmd == "dlq" {
		fs.StringVar(&c.reason, "reason", "", "only dead letters with this reason")
		fs.StringVar(&c.since, "since", "", "only dead letters since this time (RFC 3339) or for this long (24h)")
	}
	if verb == "replay" {
		fs.StringVar(&c.id, "id", "", "replay this row")
		fs.BoolVar(&c.dryRun, "dry-run", false, "show what would be replayed, change nothing")
		fs.BoolVar(&c.force, "force", false, "also replay unknown rows whose provider may not honour idempotency keys (the user may get the message twice)")
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

func listLetters(ctx context.Context, c opsConfig, f deadletter.Filter) ([]deadletter.Letter, error) {
	nc, js, err := natsconn.Connect(withConn(c.nats, "sendonce-relay-ops", 0, nil))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return deadletter.List(ctx, js, "", f)
}

func dlqList(ctx context.Context, c opsConfig, out io.Writer) error {
	f, err := c.filter()
	if err != nil {
		return err
	}
	letters, err := listLetters(ctx, c, f)
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
	return nil
}

func dlqReplay(ctx context.Context, c opsConfig, out io.Writer) error {
	var targets []outbox.ReplayTarget
	switch {
	case c.id != "" && (c.reason != "" || c.since != ""):
		return usageError{errors.New("give -id or -reason/-since, not both")}
	case c.id != "":
		id, err := uuid.Parse(c.id)
		if err != nil {
			return usageError{fmt.Errorf("-id %q is not a UUID", c.id)}
		}
		// The row's newest letter says whether its provider honours keys.
		letters, err := listLetters(ctx, c, deadletter.Filter{OutboxID: id})
		if err != nil {
			return err
		}
		t := outbox.ReplayTarget{ID: id}
		if n := len(letters); n > 0 {
			t.SafeUnknown = letters[n-1].Idempotency == deadletter.ProviderIdempotent
		}
		targets = []outbox.ReplayTarget{t}
	case c.reason != "":
		f, err := c.filter()
		if err != nil {
			return err
		}
		letters, err := listLetters(ctx, c, f)
		if err != nil {
			return err
		}
		// Each letter replays its row only if the row is still in the state
		// the letter describes: a letter from before an earlier replay, or
		// of another reason, replays nothing.
		for _, l := range letters {
			if l.OutboxID != uuid.Nil {
				targets = append(targets, l.ReplayTarget())
			}
		}
	default:
		return usageError{errors.New("give -id ID or -reason R")}
	}
	conn, err := pgx.Connect(ctx, c.databaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var results []outbox.ReplayResult
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		results, err = outbox.Replay(ctx, tx, targets, outbox.ReplayOptions{DryRun: c.dryRun, Force: c.force})
		return err
	})
	if err != nil {
		return err
	}
	replayed, refused, needForce := 0, 0, 0
	verb := "replayed"
	if c.dryRun {
		verb = "would replay"
	}
	for _, r := range results {
		switch {
		case r.Replayed && r.Status == outbox.StatusUnknown:
			replayed++
			fmt.Fprintf(out, "%s  %s (was unknown: if the provider took it, the user may get it twice; publish generation %d, same idempotency key)\n", r.ID, verb, r.Gen)
		case r.Replayed:
			replayed++
			fmt.Fprintf(out, "%s  %s (was %s; publish generation %d, same idempotency key)\n", r.ID, verb, r.Status, r.Gen)
		default:
			refused++
			if r.NeedsForce {
				needForce++
			}
			fmt.Fprintf(out, "%s  refused: %s\n", r.ID, r.Refused)
		}
	}
	fmt.Fprintf(out, "%d %s, %d refused\n", replayed, verb, refused)
	if needForce > 0 {
		fmt.Fprintf(out, "%d unknown rows need -force: their provider may not honour idempotency keys, so a replay may send them twice; check them with relay trace first\n", needForce)
	}
	if c.id != "" && refused > 0 {
		return errors.New("the row was not replayed")
	}
	return nil
}

func trace(ctx context.Context, c opsConfig, arg string, out io.Writer) error {
	id, err := uuid.Parse(arg)
	if err != nil {
		return usageError{fmt.Errorf("%q is not a UUID", arg)}
	}
	conn, err := pgx.Connect(ctx, c.databaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
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
	if row.MaybeAccepted {
		fmt.Fprintln(out, "  maybe taken   yes: an attempt may have reached the provider (a lost answer, a 5xx, or a sender that died mid-call)")
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

	fmt.Fprintf(out, "attempts (%d)\n", len(attempts))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tSTARTED\tOUTCOME\tHTTP\tCODE\tLATENCY\tSENDER\tERROR")
	for _, a := range attempts {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", a.Number, ts(a.StartedAt), a.Outcome, a.HTTPStatus, a.ProviderCode,
			a.Latency.Round(time.Microsecond), dash(a.Sender), dash(a.Error))
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
	letters, err := listLetters(ctx, c, deadletter.Filter{OutboxID: id, Since: row.CreatedAt.Add(-time.Minute)})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "dead letters (%d)\n", len(letters))
	for _, l := range letters {
		fmt.Fprintf(out, "  seq %d  %s  reason %s  attempts %d  code %d  gen %d  %s\n", l.Seq, ts(l.Time), l.Reason, l.Attempts, l.ProviderCode, l.Gen, l.Error)
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
