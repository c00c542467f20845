package console_test

import (
	"context"
	"regexp"
	"testing"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/flow"
)

// With SMS_PROVIDERS, the overview shows each provider's share of the last
// hour (rows it accepted, calls that failed, messages that moved on from
// it) and its circuit on each live sender, from the senders' heartbeats.
func TestOverviewShowsProvidersAndTheirCircuits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for i, p := range []string{"primary", "secondary", "secondary", "secondary"} {
		id := uuid.New()
		if _, err := f.owner.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, provider, attempt_count, sent_at, updated_at)
			VALUES ($1, '+15557654321', 'hello', 'sent', $2, 1, now(), now())`, id, p); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			if _, err := f.owner.Exec(ctx, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, outcome, error, provider)
				VALUES ($1, 1, now(), 'retry', 'not taken, moved to secondary: request not sent: connection refused', 'primary')`, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := flow.EnsureBucket(ctx, f.js, 1); err != nil {
		t.Fatal(err)
	}
	kv, err := f.js.KeyValue(ctx, flow.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	for key, beat := range map[string]string{
		"senders.a": `{"weight":1,"demand":0,"circuits":{"primary":"open","secondary":"closed"}}`,
		"senders.b": `{"weight":1,"demand":0,"circuits":{"primary":"half-open","secondary":"closed"}}`,
	} {
		if _, err := kv.Put(ctx, key, []byte(beat)); err != nil {
			t.Fatal(err)
		}
	}

	c, _ := f.login("victor", viewerPassword)
	_, page := f.do(c, "GET", "/", nil)
	for hook, want := range map[string]string{
		`<span data-provider-sent="primary">`:   "1",
		`<span data-provider-sent="secondary">`: "3",
		`<td data-circuit="primary">`:           `<span class="warn">open 1</span> half-open 1 `,
		`<td data-circuit="secondary">`:         "closed 2",
	} {
		end := "</span>"
		if hook[1:3] == "td" {
			end = "</td>"
		}
		m := regexp.MustCompile(regexp.QuoteMeta(hook) + `(.*?)` + end).FindStringSubmatch(page)
		if m == nil || m[1] != want {
			t.Errorf("%s shows %q, want %q", hook, m, want)
		}
	}
	if !regexp.MustCompile(`<th scope="row">primary</th>.*?<td class="n">25 %</td><td class="n">1</td><td class="n">1</td>`).MatchString(page) {
		t.Errorf("primary's line does not show a 25 %% share, one failed call and one moved on:\n%s", page)
	}
}
