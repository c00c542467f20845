package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/safetext"
	"github.com/sendonce/sendonce/internal/service"
)

const resolveUsage = `relay resolve (-id ID | -all) [-dry-run] [-limit N]
asks the provider (SMS_API_* settings, as the sender's) what became of
unknown rows and settles them: one message found -> sent, delivered or
undelivered; none -> dead (it never reached the provider: replay it to
send), unless the row's first attempt is older than
SMS_API_LOOKUP_RETENTION (the provider may no longer show what it sent);
several, or a lookup that fails -> left unknown. Rows unknown for less
than SMS_API_LOOKUP_SETTLE are skipped. At Twilio the lookup matches the
number and the body: run it with a database role that may read them.`

type resolveConfig struct {
	db          service.Database
	provider    provider.Settings
	id          string
	all, dryRun bool
	limit       int
}

func bindResolve(s *envflag.Set, c *resolveConfig) {
	service.BindDatabase(s, &c.db)
	provider.BindSettings(s, &c.provider)
	fs := s.FlagSet()
	fs.StringVar(&c.id, "id", "", "settle this row")
	fs.BoolVar(&c.all, "all", false, "settle every unknown row (up to -limit), the oldest first")
	fs.BoolVar(&c.dryRun, "dry-run", false, "look up and show what would be settled, change nothing")
	fs.IntVar(&c.limit, "limit", 1000, "the most rows looked up")
}

func runResolve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var c resolveConfig
	s := envflag.New("relay resolve", getenv, stderr)
	bindResolve(s, &c)
	if err := s.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, resolveUsage)
			return 0
		}
		fmt.Fprintf(stderr, "relay resolve: %v\n", err)
		return 2
	}
	var id uuid.UUID
	switch {
	case (c.id == "") == !c.all:
		fmt.Fprintf(stderr, "relay resolve: want -id ID or -all\n%s\n", resolveUsage)
		return 2
	case c.id != "":
		var err error
		if id, err = uuid.Parse(c.id); err != nil {
			fmt.Fprintf(stderr, "relay resolve: -id %q is not a UUID\n", c.id)
			return 2
		}
	case c.limit < 1:
		fmt.Fprintln(stderr, "relay resolve: -limit must be at least 1")
		return 2
	}
	if err := resolve(ctx, c, id, stdout); err != nil {
		fmt.Fprintf(stderr, "relay resolve: %v\n", err)
		return 1
	}
	return 0
}

// resolution is one row's lookup and what it settles.
type resolution struct {
	row     outbox.UnknownRow
	lookup  provider.LookupResult
	settle  outbox.Settlement
	skipped bool
	// expired: the lookup found nothing, but the row's first attempt is
	// older than the provider's lookup retention.
	expired bool
	moved   bool
	err     error
}

func resolve(ctx context.Context, c resolveConfig, id uuid.UUID, out io.Writer) error {
	provs, err := c.provider.LookupClients(8) // resolve is a lookup
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(provs, func(p provider.Named) bool { return p.Client.CanLookup() }) {
		return fmt.Errorf("SMS_PROVIDER / SMS_PROVIDERS: %s offers no lookup: relay resolve cannot ask it (a receipt may still settle its rows; docs/providers.md)", provs[0].Name)
	}
	// A row is looked up at the provider it names (the first when it names
	// none); with several, a "none" there is checked at the others.
	providerOf := func(name string) *provider.Client {
		for _, p := range provs {
			if p.Name == name || (name == "" && p == provs[0]) {
				return p.Client
			}
		}
		return nil
	}
	poolCfg, err := outbox.PoolConfig(c.db.URL, c.db.Pooler)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	content := false
	for _, p := range provs {
		content = content || p.Client.LookupByContent()
	}
	rows, err := outbox.UnknownRows(ctx, pool, outbox.UnknownQuery{ID: id, Limit: c.limit, Settle: c.provider.LookupSettle,
		Retention: c.provider.LookupRetention, Content: content})
	if err != nil {
		if content && strings.Contains(err.Error(), "permission denied") {
			return fmt.Errorf("%w (a lookup at Twilio matches the number and the body: use a role that may read them)", err)
		}
		return err
	}
	if id != uuid.Nil && len(rows) == 0 {
		return fmt.Errorf("row %s is not unknown (relay trace %s shows it)", id, id)
	}
	res := make([]resolution, len(rows))
	// Eight lookups at once: a provider's read API is rate limited too.
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, r := range rows {
		res[i].row = r
		if !r.Settled {
			res[i].skipped = true
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			prov := providerOf(r.Provider)
			switch {
			case prov == nil:
				res[i].lookup = provider.LookupResult{Err: fmt.Errorf("the row's provider %q is not in SMS_PROVIDERS", r.Provider)}
				return
			case !prov.CanLookup():
				res[i].lookup = provider.LookupResult{Err: fmt.Errorf("the row's provider %q offers no lookup; a receipt may still settle it", r.Provider)}
				return
			}
			q := provider.LookupQuery{Reference: r.ID.String(), To: r.To, Body: r.Body, Since: r.CreatedAt}
			res[i].lookup = prov.Lookup(ctx, q)
			if lr := res[i].lookup; lr.Err != nil || len(lr.Found) > 0 || len(provs) < 2 {
				return
			}
			// "None" at the row's provider settles it dead only if no other
			// provider of the list has it either: a failover may have lost
			// the row's move to another.
			for _, o := range provs {
				if o.Client == prov {
					continue
				}
				if !o.Client.CanLookup() {
					res[i].lookup = provider.LookupResult{Err: fmt.Errorf("provider %s of SMS_PROVIDERS, which may have the message, offers no lookup", o.Name)}
					return
				}
				if lr := o.Client.Lookup(ctx, q); lr.Err != nil || len(lr.Found) > 0 {
					res[i].lookup = lr
					return
				}
			}
		})
	}
	wg.Wait()
	counts := map[string]int{}
	for i := range res {
		x := &res[i]
		if x.skipped {
			counts["skipped"]++
			fmt.Fprintf(out, "%s  skipped: unknown for less than SMS_API_LOOKUP_SETTLE (%s)\n", x.row.ID, c.provider.LookupSettle)
			continue
		}
		x.settle = settlement(x.lookup)
		if x.settle.Status == outbox.StatusDead && x.row.BeyondRetention {
			x.settle, x.expired = pastRetention(x.settle, x.row, c.provider.LookupRetention), true
		}
		if !c.dryRun {
			x.moved, x.err = settleRow(ctx, pool, x.row, x.settle)
		}
		verdict := string(x.settle.Status)
		switch {
		case x.err != nil:
			verdict = "not written: " + x.err.Error()
			counts["errors"]++
		case x.expired:
			verdict = "stays unknown (SMS_API_LOOKUP_RETENTION " + c.provider.LookupRetention.String() + ")"
			counts["unknown"]++
			counts["expired"]++
		case x.settle.Status == "":
			verdict = "stays unknown"
			counts["unknown"]++
		case c.dryRun:
			verdict = "would be " + verdict
			counts[string(x.settle.Status)]++
		case !x.moved:
			verdict = "not moved: the row changed meanwhile"
			counts["changed"]++
		default:
			counts[string(x.settle.Status)]++
		}
		if x.settle.Status == outbox.StatusDead && x.err == nil {
			verdict += " (it never reached the provider: relay dlq replay -id " + x.row.ID.String() + " sends it)"
		}
		// The detail and an error may carry a provider's or the
		// database's words: no terminal controls or bidi overrides.
		fmt.Fprintf(out, "%s  %s -> %s\n", x.row.ID, safetext.Field(x.settle.Lookup.Detail), safetext.Clean(verdict))
	}
	fmt.Fprintf(out, "looked up %d of %d unknown rows: sent %d, delivered %d, undelivered %d, dead %d, still unknown %d, skipped %d",
		len(rows)-counts["skipped"], len(rows), counts["sent"], counts["delivered"], counts["undelivered"], counts["dead"],
		counts["unknown"], counts["skipped"])
	if counts["expired"] > 0 {
		fmt.Fprintf(out, ", past the lookup retention %d", counts["expired"])
	}
	if counts["changed"]+counts["errors"] > 0 {
		fmt.Fprintf(out, ", changed meanwhile %d, errors %d", counts["changed"], counts["errors"])
	}
	if c.dryRun {
		fmt.Fprint(out, " (dry run: nothing written)")
	}
	fmt.Fprintln(out)
	if counts["errors"] > 0 {
		return fmt.Errorf("%d rows not written", counts["errors"])
	}
	return nil
}

// settlement maps a lookup of an unknown row to what it settles.
func settlement(l provider.LookupResult) outbox.Settlement {
	s := outbox.Settlement{Lookup: outbox.Evidence{Kind: "lookup", ReceivedAt: time.Now(), Source: "resolve"}}
	switch {
	case l.Err != nil:
		s.Lookup.Result, s.Lookup.Detail = "failed", "lookup failed: "+l.Err.Error()
	case len(l.Found) == 0:
		s.Status = outbox.StatusDead
		s.Lookup.Result, s.Lookup.Detail = "none", "lookup: the provider has no message for this reference"
	case len(l.Found) == 1:
		m := l.Found[0]
		s.Status, s.ProviderRef = outbox.StatusSent, m.Ref
		switch m.Status {
		case "delivered":
			s.Status = outbox.StatusDelivered
		case "undelivered":
			s.Status = outbox.StatusUndelivered
		}
		s.Lookup.Result, s.Lookup.ProviderRef = "found", m.Ref
		s.Lookup.Detail = fmt.Sprintf("lookup: the provider has the message (%s)", m.Status)
	default:
		s.Lookup.Result = "several"
		s.Lookup.Detail = fmt.Sprintf("lookup: the provider has %d messages for this reference: it was sent more than once", len(l.Found))
	}
	return s
}

// pastRetention is what an empty lookup settles for a row whose first
// attempt is older than the provider's lookup retention: nothing. The
// provider may have taken the message and no longer show it, and dead
// would promise the user got nothing; the row stays unknown, the lookup
// recorded with the reason.
func pastRetention(s outbox.Settlement, r outbox.UnknownRow, retention time.Duration) outbox.Settlement {
	s.Status = ""
	// An age, not a time: the detail is shown with runs of digits masked.
	s.Lookup.Detail = fmt.Sprintf("lookup: the provider has no message for this reference, but the row's first attempt, %s ago, is older than the provider's lookup retention (%s): left unknown",
		time.Since(r.FirstAttempt).Round(time.Minute), retention)
	return s
}

func settleRow(ctx context.Context, pool *pgxpool.Pool, r outbox.UnknownRow, s outbox.Settlement) (bool, error) {
	var moved bool
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		moved, err = outbox.Settle(ctx, tx, r.ID, r.Gen, s)
		return err
	})
	return moved, err
}
