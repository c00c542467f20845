package console

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/sendonce/sendonce/internal/outbox"
)

// suppressionsView is the suppression list's page: a page of the list
// (numbers masked), the console's recent changes to it, and the answer to
// the form just posted.
type suppressionsView struct {
	Entries  []outbox.SuppressionEntry
	After    int64
	Next     int64
	Changes  []outbox.ConsoleAction
	Operator bool
	// Checked is the masked number a check or a change was about, with
	// what was found (Entry nil: not on the list) and the removals.
	Checked  string
	Entry    *outbox.SuppressionEntry
	Removals []outbox.SuppressionRemoval
	// Done says what a change did; Problem why a form was refused.
	Done, Problem string
}

// maxReasonChars bounds a reason typed in the console, as the database
// keeps it.
const maxReasonChars = 200

// suppressions serves GET /suppressions: the list a page at a time
// (?after=SEQ), newest changes from the console, and the forms.
func (c *Console) suppressions(w http.ResponseWriter, r *http.Request, s *session) {
	v := suppressionsView{Operator: s.user.Role == RoleOperator}
	if a := r.URL.Query().Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 0 {
			c.fail(w, r, s, http.StatusBadRequest, "after: want the number of an entry.")
			return
		}
		v.After = n
	}
	c.renderSuppressions(w, r, s, http.StatusOK, v)
}

func (c *Console) renderSuppressions(w http.ResponseWriter, r *http.Request, s *session, status int, v suppressionsView) {
	ctx, cancel := c.timeout(r)
	defer cancel()
	var err error
	if v.Entries, v.Next, err = outbox.Suppressions(ctx, c.cfg.Pool, v.After, c.cfg.PageSize); err != nil {
		c.internal(w, r, s, "list the suppression list", err)
		return
	}
	if v.Changes, err = outbox.ConsoleSuppressions(ctx, c.cfg.Pool, 10); err != nil {
		c.internal(w, r, s, "read the console's changes to the list", err)
		return
	}
	c.render(w, status, "suppressions", pageFor(s, "Suppression list", "suppressions", v))
}

// formNumber reads the form's number: E.164, or a refusal that does not
// repeat it.
func formNumber(r *http.Request) (string, string) {
	n := strings.TrimSpace(r.PostFormValue("number"))
	if !outbox.ValidNumber(n) {
		return "", `The number must be E.164: "+" and 2 to 15 digits, the first not 0.`
	}
	return n, ""
}

// suppressionCheck serves POST /suppressions/check: whether a number is on
// the list (a POST, so that the number stays out of URLs and access logs).
func (c *Console) suppressionCheck(w http.ResponseWriter, r *http.Request, s *session) {
	v := suppressionsView{Operator: s.user.Role == RoleOperator}
	n, problem := formNumber(r)
	if problem != "" {
		v.Problem = problem
		c.renderSuppressions(w, r, s, http.StatusBadRequest, v)
		return
	}
	ctx, cancel := c.timeout(r)
	defer cancel()
	var err error
	if v.Entry, v.Removals, err = outbox.CheckSuppression(ctx, c.cfg.Pool, n); err != nil {
		c.internal(w, r, s, "check a number", err)
		return
	}
	v.Checked = outbox.MaskPhone(n)
	c.renderSuppressions(w, r, s, http.StatusOK, v)
}

// suppressionChange serves POST /suppressions/add and
// /suppressions/remove (operators only): the change and its audit row, in
// one statement; a removal needs a reason.
func (c *Console) suppressionChange(remove bool) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		v := suppressionsView{Operator: true}
		n, problem := formNumber(r)
		reason := strings.TrimSpace(r.PostFormValue("reason"))
		switch {
		case problem != "":
		case reason == "":
			problem = "Say why: the reason is recorded with the change."
		case len([]rune(reason)) > maxReasonChars:
			problem = fmt.Sprintf("A reason is at most %d characters.", maxReasonChars)
		}
		if problem != "" {
			v.Problem = problem
			c.renderSuppressions(w, r, s, http.StatusBadRequest, v)
			return
		}
		ctx, cancel := c.timeout(r)
		defer cancel()
		change := outbox.ConsoleSuppression{User: s.user.Name, Role: string(s.user.Role), Remote: c.remote(r),
			Remove: remove, Number: n, Reason: reason}
		if err := outbox.ConsoleSuppress(ctx, c.cfg.Pool, &change); err != nil {
			c.internal(w, r, s, "change the suppression list", err)
			return
		}
		action := "suppress"
		if remove {
			action = "unsuppress"
		}
		c.log.InfoContext(ctx, "console: "+action, "user", s.user.Name, "role", string(s.user.Role), "remote", change.Remote,
			"audit_id", change.AuditID, "changed", change.Changed)
		v.Checked = outbox.MaskPhone(n)
		switch {
		case remove && change.Changed:
			v.Done = v.Checked + " was removed from the list: messages to it are sent again."
		case remove:
			v.Done = v.Checked + " was not on the list."
		case change.Changed:
			v.Done = v.Checked + " was added to the list: no provider is called for it."
		default:
			v.Done = v.Checked + " was already on the list."
		}
		var err error
		if v.Entry, v.Removals, err = outbox.CheckSuppression(ctx, c.cfg.Pool, n); err != nil {
			c.internal(w, r, s, "check a number", err)
			return
		}
		c.renderSuppressions(w, r, s, http.StatusOK, v)
	}
}
