package console

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/flow"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/wire"
)

// maxForm bounds a POST body.
const maxForm = 1 << 20

// authed runs h for a request with a live session. Without one, a GET is
// sent to the login page and anything else is refused (401). A POST must
// carry the session's CSRF token (403 otherwise, before anything runs).
func (c *Console) authed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := c.sessions.get(r, c.now())
		if s == nil {
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, "/login", http.StatusSeeOther)
				return
			}
			c.fail(w, r, nil, http.StatusUnauthorized, "Log in first.")
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
			if !s.validCSRF(r) {
				c.log.WarnContext(r.Context(), "console: request without a valid csrf token refused", "user", s.user.Name, "path", r.URL.Path, "remote", c.remote(r))
				c.fail(w, r, s, http.StatusForbidden, "This form is stale or did not come from the console (missing or wrong CSRF token). Reload the page and try again.")
				return
			}
		}
		h(w, r, s)
	}
}

// operator lets only operators through.
func (c *Console) operator(h func(http.ResponseWriter, *http.Request, *session)) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		if s.user.Role != RoleOperator {
			c.log.WarnContext(r.Context(), "console: viewer's change refused", "user", s.user.Name, "path", r.URL.Path, "remote", c.remote(r))
			c.fail(w, r, s, http.StatusForbidden, "Only an operator may replay or change the suppression list.")
			return
		}
		h(w, r, s)
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.sessions.get(r, c.now()) != nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	c.render(w, http.StatusOK, "login", page{Title: "Log in", Data: loginView{}})
}

// sameOrigin refuses a login posted from another site (login CSRF): a
// browser says where a POST comes from in Sec-Fetch-Site and Origin; a
// tool that sends neither is let through.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" || o == "null" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// loginView is the login page's data.
type loginView struct{ Error, Username string }

// maxLoginForm bounds a login's body: a name is at most 64 bytes, and
// bcrypt reads no more than 72 of a password.
const maxLoginForm = 4 << 10

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginForm)
	if !sameOrigin(r) {
		c.fail(w, r, nil, http.StatusForbidden, "A login must come from the console's own page.")
		return
	}
	if err := r.ParseForm(); err != nil {
		if _, big := errors.AsType[*http.MaxBytesError](err); big {
			c.fail(w, r, nil, http.StatusRequestEntityTooLarge, "A login form is at most 4 KiB.")
			return
		}
		c.fail(w, r, nil, http.StatusBadRequest, "The login form could not be read.")
		return
	}
	name, password := r.PostFormValue("username"), r.PostFormValue("password")
	now, ip, key := c.now(), c.remote(r), c.throttleKey(r)
	if !userName.MatchString(name) {
		// No user has such a name: refused before it reaches the
		// throttle, a log line or the page.
		c.log.WarnContext(r.Context(), "console: login failed", "user", "(invalid)", "remote", ip)
		c.render(w, http.StatusUnauthorized, "login", page{Title: "Log in", Data: loginView{
			Error: "Wrong user name or password."}})
		return
	}
	if wait := c.limiter.wait(name, key, now); wait > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		c.render(w, http.StatusTooManyRequests, "login", page{Title: "Log in", Data: loginView{
			Error: fmt.Sprintf("Too many failed logins: try again in %s.", wait.Round(time.Second)), Username: name}})
		return
	}
	// Only now is the password compared: the budget of comparisons is
	// taken first, so that a login it refuses costs no bcrypt work.
	if wait, why, first := c.budget.take(key, now); why != allowed {
		if first {
			// Once each time a budget runs dry, not per refusal.
			budgetName := "client"
			if why == totalSpent {
				budgetName = "console"
			}
			c.log.WarnContext(r.Context(), "console: logins refused: password checks over budget", "budget", budgetName, "remote", ip)
		}
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(wait.Seconds())))))
		c.render(w, http.StatusTooManyRequests, "login", page{Title: "Log in", Data: loginView{
			Error: fmt.Sprintf("Too many logins at once: try again in %s.", max(time.Second, wait.Round(time.Second))), Username: name}})
		return
	}
	u, ok := authenticate(c.users, c.dummy, name, password)
	if !ok {
		// A name nobody has may be a password typed in the wrong box.
		_, known := c.users[name]
		c.limiter.fail(name, key, known, now)
		logged := "(unknown)"
		if known {
			logged = name
		}
		c.log.WarnContext(r.Context(), "console: login failed", "user", logged, "remote", ip)
		c.render(w, http.StatusUnauthorized, "login", page{Title: "Log in", Data: loginView{
			Error: "Wrong user name or password.", Username: name}})
		return
	}
	c.limiter.clear(name, key)
	s := c.sessions.create(u, now)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: s.token, Path: "/", MaxAge: int(c.cfg.SessionTTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.cfg.SecureCookie || r.TLS != nil,
	})
	c.log.InfoContext(r.Context(), "console: login", "user", u.Name, "role", string(u.Role), "remote", ip)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, s *session) {
	c.sessions.end(s.token)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: c.cfg.SecureCookie || r.TLS != nil})
	c.log.InfoContext(r.Context(), "console: logout", "user", s.user.Name)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// logoutOthers ends every other session of the user's (a browser left
// logged in elsewhere, a cookie that may have been taken) and keeps this
// one. Like logins and logouts it is logged, not written to the replay
// audit table.
func (c *Console) logoutOthers(w http.ResponseWriter, r *http.Request, s *session) {
	n := c.sessions.endOthers(s)
	c.log.InfoContext(r.Context(), "console: other sessions logged out", "user", s.user.Name, "ended", n, "remote", c.remote(r))
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// timeout bounds one request's database and NATS work.
func (c *Console) timeout(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), c.cfg.DBTimeout)
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := c.timeout(r)
	defer cancel()
	v, err := c.loadOverview(ctx)
	if err != nil {
		c.internal(w, r, s, "read the overview", err)
		return
	}
	p := pageFor(s, "Overview", "overview", v)
	p.Refresh = int(c.cfg.Refresh / time.Millisecond)
	c.render(w, http.StatusOK, "overview", p)
}

// overviewView is the overview page's data.
type overviewView struct {
	At             time.Time
	Statuses       []statusLine
	RelayLag       time.Duration
	OldestUrgent   time.Duration
	OldestPending  outbox.OldestRow
	OldestInFlight outbox.OldestRow
	SendsPerSecond float64
	TriesPerSecond float64
	DeadLastHour   []reasonCount
	Chart          chart
	// Providers are the named providers (SMS_PROVIDERS): each one's share
	// of the last hour and its circuits as the live senders report them.
	Providers []providerLine
	// CircuitsUnread is set when the senders' heartbeats could not be read.
	CircuitsUnread bool
}

type providerLine struct {
	outbox.ProviderShare
	flow.Circuit
	// Share is Sent as a fraction of every provider's.
	Share float64
}

type statusLine struct {
	outbox.StatusCount
	Hour, Day outbox.WindowCount
}

type reasonCount struct {
	Reason string
	Rows   int64
}

// windowLimit bounds the counts of the last hour and day per index: an
// index-only count of 500,000 entries takes ~40 ms.
const windowLimit = 500_000

func (c *Console) loadOverview(ctx context.Context) (overviewView, error) {
	db := c.cfg.Pool
	v := overviewView{At: c.now()}
	counts, err := outbox.CountStatuses(ctx, db, c.cfg.ExactBelow)
	if err != nil {
		return v, err
	}
	hour, err := outbox.CountChanged(ctx, db, v.At.Add(-time.Hour), windowLimit)
	if err != nil {
		return v, err
	}
	day, err := outbox.CountChanged(ctx, db, v.At.Add(-24*time.Hour), windowLimit)
	if err != nil {
		return v, err
	}
	for i, sc := range counts {
		v.Statuses = append(v.Statuses, statusLine{StatusCount: sc, Hour: hour[i], Day: day[i]})
	}
	if v.OldestPending, v.OldestInFlight, err = outbox.OldestRows(ctx, db); err != nil {
		return v, err
	}
	if v.OldestPending.Found {
		v.RelayLag = max(0, v.At.Sub(v.OldestPending.Since))
	}
	if v.OldestUrgent, err = outbox.OldestUrgent(ctx, db); err != nil {
		return v, err
	}
	since := v.At.Add(-time.Hour).Truncate(time.Second)
	minutes, err := outbox.AttemptsPerMinute(ctx, db, since)
	if err != nil {
		return v, err
	}
	v.Chart = newChart(since, minutes)
	if n := len(v.Chart.Bars); n > 0 {
		last := v.Chart.Bars[n-1].Counts
		v.SendsPerSecond = float64(last.Sent) / 60
		v.TriesPerSecond = float64(last.Sent+last.Retry+last.Failed) / 60
	}
	dead, err := outbox.DeadByReason(ctx, db, since)
	if err != nil {
		return v, err
	}
	for _, reason := range reasons {
		v.DeadLastHour = append(v.DeadLastHour, reasonCount{reason, dead[reason]})
	}
	if v.Providers, v.CircuitsUnread, err = c.loadProviders(ctx, since); err != nil {
		return v, err
	}
	return v, nil
}

// circuitsLiveFor is how recent a sender's heartbeat must be for the
// circuits it carries to count: senders beat every half second.
const circuitsLiveFor = 10 * time.Second

// loadProviders joins each named provider's share since since with its
// circuits as the senders last reported them; unread is set when the
// heartbeats could not be read (the shares are still shown).
func (c *Console) loadProviders(ctx context.Context, since time.Time) (lines []providerLine, unread bool, err error) {
	shares, err := outbox.ProviderShares(ctx, c.cfg.Pool, since)
	if err != nil {
		return nil, false, err
	}
	circuits, cerr := flow.ReadCircuits(ctx, c.cfg.JetStream.Conn(), "", circuitsLiveFor)
	if cerr != nil {
		c.log.Debug("console: read the senders' circuits", "err", cerr)
	}
	by := map[string]*providerLine{}
	var order []string
	line := func(p string) *providerLine {
		if by[p] == nil {
			by[p] = &providerLine{}
			by[p].ProviderShare.Provider, by[p].Circuit.Provider = p, p
			order = append(order, p)
		}
		return by[p]
	}
	var total int64
	for _, s := range shares {
		line(s.Provider).ProviderShare = s
		total += s.Sent
	}
	for _, ci := range circuits {
		line(ci.Provider).Circuit = ci
	}
	slices.Sort(order)
	for _, p := range order {
		l := by[p]
		if total > 0 {
			l.Share = float64(l.Sent) / float64(total)
		}
		lines = append(lines, *l)
	}
	return lines, cerr != nil && len(lines) > 0, nil
}

// reasons are the dead-letter reasons, in the order the pages list them.
var reasons = []string{wire.ReasonPermanent, wire.ReasonMaxAttempts, wire.ReasonAmbiguous, wire.ReasonInvalid}

// sinceChoices are the time filters the dead-letter page offers; a Go
// duration or an RFC 3339 time is accepted too, as relay dlq takes them.
var sinceChoices = []string{"1h", "6h", "24h", "7d", "30d", "all"}

// parseSince reads a since filter: "all", a duration back from now (with d
// for days), or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	switch {
	case s == "all":
		return time.Time{}, nil
	case strings.HasSuffix(s, "d"):
		if n, err := strconv.Atoi(strings.TrimSuffix(s, "d")); err == nil && n > 0 {
			return now.AddDate(0, 0, -n), nil
		}
	default:
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			return now.Add(-d), nil
		}
		if t, err := time.Parse(time.RFC3339, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("since %q: want all, a duration such as 24h or 7d, or an RFC 3339 time", s)
}

// deadView is the dead-letter page's data.
type deadView struct {
	Reason, Since, Until, Code string
	Reasons, SinceChoices      []string
	Summary                    outbox.DeadSummary
	Codes                      []codeCount
	Rows                       []outbox.DeadRow
	PageSize                   int
	Replays                    []outbox.ConsoleReplay
	Operator                   bool
}

type codeCount struct {
	Code int
	Rows int64
}

func (c *Console) deadFilter(q url.Values, now time.Time) (outbox.DeadFilter, deadView, error) {
	v := deadView{Reason: q.Get("reason"), Since: q.Get("since"), Until: q.Get("until"), Code: q.Get("code"),
		Reasons: reasons, SinceChoices: sinceChoices, PageSize: c.cfg.PageSize}
	if v.Since == "" {
		v.Since = "24h"
	}
	if !slices.Contains(v.SinceChoices, v.Since) {
		v.SinceChoices = append(slices.Clone(v.SinceChoices), v.Since)
	}
	f := outbox.DeadFilter{Reason: v.Reason}
	if v.Reason != "" && !slices.Contains(reasons, v.Reason) {
		return f, v, fmt.Errorf("reason %q: want one of %s", v.Reason, strings.Join(reasons, ", "))
	}
	var err error
	if f.Since, err = parseSince(v.Since, now); err != nil {
		return f, v, err
	}
	if v.Until != "" {
		if f.Until, err = time.Parse(time.RFC3339, v.Until); err != nil {
			return f, v, fmt.Errorf("until %q: want an RFC 3339 time", v.Until)
		}
	}
	if v.Code != "" {
		n, err := strconv.Atoi(v.Code)
		if err != nil {
			return f, v, fmt.Errorf("code %q: want a number (0: no provider code)", v.Code)
		}
		f.ProviderCode = &n
	}
	return f, v, nil
}

func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request, s *session) {
	f, v, err := c.deadFilter(r.URL.Query(), c.now())
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err.Error())
		return
	}
	v.Operator = s.user.Role == RoleOperator
	ctx, cancel := c.timeout(r)
	defer cancel()
	db := c.cfg.Pool
	if v.Rows, err = outbox.DeadRows(ctx, db, f, c.cfg.PageSize); err != nil {
		c.internal(w, r, s, "list the dead letters", err)
		return
	}
	if v.Summary, err = outbox.SummarizeDead(ctx, db, f, summaryLimit); err != nil {
		c.internal(w, r, s, "count the dead letters", err)
		return
	}
	for code, n := range v.Summary.ByCode {
		v.Codes = append(v.Codes, codeCount{code, n})
	}
	slices.SortFunc(v.Codes, func(a, b codeCount) int {
		if a.Rows != b.Rows {
			return int(b.Rows - a.Rows)
		}
		return a.Code - b.Code
	})
	if v.Replays, err = outbox.ConsoleReplays(ctx, db, uuid.Nil, 10); err != nil {
		c.internal(w, r, s, "read the replays", err)
		return
	}
	c.render(w, http.StatusOK, "deadletters", pageFor(s, "Dead letters", "dead", v))
}

// summaryLimit bounds the rows the dead-letter page's counts read.
const summaryLimit = 10_000

// replayView is the replay preview's or result's data.
type replayView struct {
	DryRun   bool
	Lines    []replayLine
	Replayed int
	Refused  int
	AuditID  int64
	// Letters are the dead letters a confirmation replays from.
	Letters []uint64
}

type replayLine struct {
	outbox.ReplayResult
	LetterSeq uint64
}

func (c *Console) replay(w http.ResponseWriter, r *http.Request, s *session) {
	action := r.PostFormValue("action")
	if action != "preview" && action != "confirm" {
		c.fail(w, r, s, http.StatusBadRequest, "Want action preview or confirm.")
		return
	}
	var ids []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, raw := range r.PostForm["id"] {
		id, err := uuid.Parse(raw)
		if err != nil {
			c.fail(w, r, s, http.StatusBadRequest, "A selected id is not a UUID.")
			return
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		c.fail(w, r, s, http.StatusBadRequest, "Select at least one dead letter.")
		return
	}
	if len(ids) > c.cfg.PageSize {
		c.fail(w, r, s, http.StatusBadRequest, fmt.Sprintf("Select at most %d dead letters at once.", c.cfg.PageSize))
		return
	}
	ctx, cancel := c.timeout(r)
	defer cancel()
	var seqs []uint64
	if action == "preview" {
		// The letters that describe the rows' current states.
		bySeq, err := outbox.LetterSeqs(ctx, c.cfg.Pool, ids)
		if err != nil {
			c.internal(w, r, s, "find the dead letters", err)
			return
		}
		for _, seq := range bySeq {
			seqs = append(seqs, seq)
		}
	} else {
		// Exactly the letters the preview showed: a row that changed since
		// is refused as stale, not replayed on a letter nobody looked at.
		for _, raw := range r.PostForm["letter"] {
			seq, err := strconv.ParseUint(raw, 10, 64)
			if err != nil {
				c.fail(w, r, s, http.StatusBadRequest, "A letter is not a sequence number.")
				return
			}
			seqs = append(seqs, seq)
		}
	}
	v, err := c.replayLetters(ctx, r, s, ids, seqs, action == "preview")
	if err != nil {
		c.internal(w, r, s, "replay", err)
		return
	}
	title := "Replayed"
	if v.DryRun {
		title = "Replay: preview"
	}
	c.render(w, http.StatusOK, "replay", pageFor(s, title, "dead", v))
}

// replayLetters replays ids from the letters at seqs by outbox.Replay's
// rules, as relay dlq replay does: each row only while it is in the state
// its letter describes. Unless dryRun, the replay is recorded in the audit
// table in the same transaction, and logged.
func (c *Console) replayLetters(ctx context.Context, r *http.Request, s *session, ids []uuid.UUID, seqs []uint64, dryRun bool) (replayView, error) {
	v := replayView{DryRun: dryRun}
	letters, err := deadletter.BySequence(ctx, c.cfg.JetStream, "", seqs)
	if err != nil {
		return v, err
	}
	wanted := map[uuid.UUID]bool{}
	for _, id := range ids {
		wanted[id] = true
	}
	var targets []outbox.ReplayTarget
	letterOf := map[uuid.UUID]uint64{}
	for _, l := range letters {
		if wanted[l.OutboxID] {
			targets = append(targets, l.ReplayTarget())
			letterOf[l.OutboxID] = l.Seq
		}
	}
	var results []outbox.ReplayResult
	audit := outbox.ConsoleReplay{User: s.user.Name, Role: string(s.user.Role), Requested: ids, Remote: c.remote(r)}
	err = pgx.BeginFunc(ctx, c.cfg.Pool, func(tx pgx.Tx) error {
		if dryRun && len(targets) == 0 {
			return nil
		}
		// Never forced: an unknown row whose provider may not honour
		// idempotency keys, and a row with evidence that the provider may
		// have its message, are refused with the reason shown; they are
		// for relay dlq replay -force, after a look with relay trace. A
		// button that sends a message twice is one click too close. The
		// database moves the rows and records the replay in the audit
		// table (even one that replayed nothing) in one statement: the
		// console's role may do neither itself.
		var err error
		results, err = outbox.Replay(ctx, tx, targets, outbox.ReplayOptions{DryRun: dryRun, Audit: &audit})
		return err
	})
	if err != nil {
		return v, err
	}
	byID := map[uuid.UUID]outbox.ReplayResult{}
	for _, res := range results {
		byID[res.ID] = res
	}
	for _, id := range ids {
		res, ok := byID[id]
		if !ok {
			res = outbox.ReplayResult{ID: id, Refused: "no stored dead letter describes its current state (not dead or unknown now, or its letter is not stored yet); relay trace shows it"}
		}
		line := replayLine{ReplayResult: res, LetterSeq: letterOf[id]}
		if res.Replayed {
			v.Replayed++
			v.Letters = append(v.Letters, line.LetterSeq)
		} else {
			v.Refused++
		}
		v.Lines = append(v.Lines, line)
	}
	if !dryRun {
		v.AuditID = audit.ID
		replayed := make([]string, len(audit.Replayed))
		for i, id := range audit.Replayed {
			replayed[i] = id.String()
		}
		c.log.InfoContext(ctx, "console: replay", "user", s.user.Name, "role", string(s.user.Role), "remote", audit.Remote,
			"audit_id", audit.ID, "requested", len(ids), "replayed", len(audit.Replayed), "refused", audit.Refused,
			"replayed_ids", strings.Join(replayed, ","))
	}
	return v, nil
}

// searchView is the search page's data.
type searchView struct {
	Q   string
	IDs []uuid.UUID
}

func (c *Console) search(w http.ResponseWriter, r *http.Request, s *session) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	v := searchView{Q: q}
	if q == "" {
		c.render(w, http.StatusOK, "search", pageFor(s, "Find a message", "message", v))
		return
	}
	if id, err := uuid.Parse(q); err == nil {
		http.Redirect(w, r, "/messages/"+id.String(), http.StatusSeeOther)
		return
	}
	ctx, cancel := c.timeout(r)
	defer cancel()
	ids, err := outbox.FindByProviderRef(ctx, c.cfg.Pool, q)
	if err != nil {
		c.internal(w, r, s, "search", err)
		return
	}
	if len(ids) == 1 {
		http.Redirect(w, r, "/messages/"+ids[0].String(), http.StatusSeeOther)
		return
	}
	v.IDs = ids
	status := http.StatusOK
	if len(ids) == 0 {
		status = http.StatusNotFound
	}
	c.render(w, status, "search", pageFor(s, "Find a message", "message", v))
}

// messageView is a message page's data.
type messageView struct {
	Row outbox.MaskedMessage
	// Suppression is the entry of the message's number on the
	// suppression list, nil when it is not on it.
	Suppression *outbox.SuppressionEntry
	Attempts    []outbox.Attempt
	Letters     []deadletter.Letter
	LettersErr  string
	Replays     []outbox.ConsoleReplay
	Evidence    []outbox.Evidence
	Events      []event
}

// count returns how many of v's receipts and lookups are of kind.
func (v messageView) count(kind string) int {
	n := 0
	for _, e := range v.Evidence {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// Receipts and Lookups count the message's evidence, for the page.
func (v messageView) Receipts() int { return v.count("receipt") }
func (v messageView) Lookups() int  { return v.count("lookup") }

func (c *Console) message(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, s, http.StatusNotFound, "A message id is a UUID.")
		return
	}
	ctx, cancel := c.timeout(r)
	defer cancel()
	var v messageView
	v.Row, err = outbox.MaskedRow(ctx, c.cfg.Pool, id)
	if errors.Is(err, outbox.ErrNotFound) {
		c.fail(w, r, s, http.StatusNotFound, "No message has the id "+id.String()+" (or retention has purged it).")
		return
	}
	if err != nil {
		c.internal(w, r, s, "read the message", err)
		return
	}
	if v.Suppression, err = outbox.SuppressionOf(ctx, c.cfg.Pool, id); err != nil {
		c.internal(w, r, s, "read the suppression of the message's number", err)
		return
	}
	if v.Attempts, err = outbox.Attempts(ctx, c.cfg.Pool, id); err != nil {
		c.internal(w, r, s, "read the attempts", err)
		return
	}
	if v.Evidence, err = outbox.EvidenceOf(ctx, c.cfg.Pool, id); err != nil {
		c.internal(w, r, s, "read the receipts and lookups", err)
		return
	}
	if v.Replays, err = outbox.ConsoleReplays(ctx, c.cfg.Pool, id, 100); err != nil {
		c.internal(w, r, s, "read the replays", err)
		return
	}
	// A message that never failed has no letters: skip reading the stream.
	if v.Row.Gen > 0 || v.Row.LetterSeq != nil || v.Row.EndReason != "" {
		v.Letters, err = deadletter.List(ctx, c.cfg.JetStream, "", deadletter.Filter{OutboxID: id, Since: v.Row.CreatedAt.Add(-time.Minute)})
		if err != nil {
			c.log.WarnContext(ctx, "console: read dead letters", "err", err)
			v.LettersErr = "The dead letters could not be read from NATS just now."
		}
	}
	v.Events = timeline(v)
	c.render(w, http.StatusOK, "message", pageFor(s, "Message "+id.String(), "message", v))
}
