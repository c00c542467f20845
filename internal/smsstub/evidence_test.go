package smsstub

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

var testSecret = []byte("stub-test-secret-0123456789abcd")

// sink is a callback URL that keeps the receipts it verified.
type sink struct {
	mu       sync.Mutex
	receipts []map[string]any
	forged   int
	url      string
}

func newSink(t *testing.T) *sink {
	k := &sink{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		k.mu.Lock()
		defer k.mu.Unlock()
		if receiver.VerifyGeneric([][]byte{testSecret}, r.Header.Get(receiver.HeaderSignature), body, time.Now(), time.Minute) != nil {
			k.forged++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var m map[string]any
		_ = json.Unmarshal(body, &m)
		k.receipts = append(k.receipts, m)
	}))
	t.Cleanup(ts.Close)
	k.url = ts.URL
	return k
}

func (k *sink) got() []map[string]any {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]map[string]any(nil), k.receipts...)
}

func lookup(t *testing.T, s *testStub, ref string) (int, lookupResponse) {
	t.Helper()
	resp, err := s.client.Get(s.url + "/v1/messages?reference=" + ref)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out lookupResponse
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// Accepted messages are found by their reference, queued until their fate
// is known and then delivered or undelivered (by number); each gets a
// signed receipt at its callback_url, twice and followed by an older one
// when asked.
func TestReceiptsAndLookup(t *testing.T) {
	t.Parallel()
	k := newSink(t)
	s := newStub(t, Config{IgnoreKeys: true, Receipts: Receipts{Secret: testSecret, Delay: 300 * time.Millisecond,
		DuplicateRate: 1, ReorderRate: 1, UndeliveredSuffixes: []string{"0013"}}})
	ctx := context.Background()
	send := func(ref, to string) {
		body := `{"to":"` + to + `","body":"hi","reference":"` + ref + `","callback_url":"` + k.url + `/v1/receipts/generic"}`
		if r, err := post(ctx, s.client, s.url, ref, body); err != nil || r.status != 201 {
			t.Fatalf("post: %v %v", r.status, err)
		}
	}
	send("ref-a", "+15550000001")
	send("ref-b", "+15550000013")
	send("ref-b", "+15550000013") // no idempotency: a second message
	if code, got := lookup(t, s, "ref-a"); code != 200 || len(got.Messages) != 1 || got.Messages[0].Status != "queued" {
		t.Fatalf("lookup before the fate: %d %+v", code, got)
	}
	if _, got := lookup(t, s, "ref-none"); len(got.Messages) != 0 {
		t.Fatalf("lookup of a reference never sent: %+v", got)
	}
	testkit.WaitFor(t, 10*time.Second, "9 receipts", func() bool { return len(k.got()) == 9 })
	if _, got := lookup(t, s, "ref-b"); len(got.Messages) != 2 || got.Messages[0].Status != "undelivered" {
		t.Fatalf("lookup after the fate: %+v", got)
	}
	byRef := map[string][]string{}
	for _, r := range k.got() {
		byRef[r["reference"].(string)] = append(byRef[r["reference"].(string)], r["status"].(string))
	}
	if a := byRef["ref-a"]; len(a) != 3 || a[0] != "delivered" || a[1] != "delivered" || a[2] != "accepted" {
		t.Errorf("receipts of ref-a: %v, want delivered twice then accepted", a)
	}
	if b := byRef["ref-b"]; len(b) != 6 || b[0] != "undelivered" {
		t.Errorf("receipts of ref-b: %v", b)
	}
	// The stub counts a receipt once the sink's answer is back, a moment
	// after the sink has it.
	testkit.WaitFor(t, 10*time.Second, "the stub's count of 9 receipts", func() bool {
		st, d := s.Stats(), s.Deliveries()
		return st.ReceiptsSent == 9 && d["ref-a"].ReceiptAcked && d["ref-b"].ReceiptAcked
	})
	if st := s.Stats(); st.ReceiptsSent != 9 || st.Lookups != 3 || k.forged != 0 || st.ReceiptsGivenUp != 0 {
		t.Errorf("stats %+v, forged %d", st, k.forged)
	}
	// Per key: the last delivery's fate, its receipt acknowledged.
	d := s.Deliveries()
	if a := d["ref-a"]; a.Fate != "delivered" || !a.ReceiptAcked || a.Deliveries != 1 {
		t.Errorf("ref-a: %+v", a)
	}
	if b := d["ref-b"]; b.Fate != "undelivered" || !b.ReceiptAcked || b.Deliveries != 2 {
		t.Errorf("ref-b: %+v", b)
	}
}

// A receipt no try gets a 2xx for is given up and counted; its key's
// delivery stays unacknowledged. A message sent without a callback_url has
// no fate recorded.
func TestReceiptGivenUp(t *testing.T) {
	t.Parallel()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(refusing.Close)
	s := newStub(t, Config{IgnoreKeys: true, Receipts: Receipts{Secret: testSecret, Delay: time.Millisecond}})
	s.receiptBackoff = time.Millisecond
	ctx := context.Background()
	for _, b := range []string{
		`{"to":"+15550000001","body":"hi","reference":"ref-x","callback_url":"` + refusing.URL + `/v1/receipts/generic"}`,
		`{"to":"+15550000002","body":"hi","reference":"ref-y"}`,
	} {
		var m map[string]string
		_ = json.Unmarshal([]byte(b), &m)
		if r, err := post(ctx, s.client, s.url, m["reference"], b); err != nil || r.status != 201 {
			t.Fatalf("post: %v %v", r.status, err)
		}
	}
	testkit.WaitFor(t, 30*time.Second, "the receipt given up", func() bool { return s.Stats().ReceiptsGivenUp == 1 })
	d := s.Deliveries()
	if x := d["ref-x"]; x.Fate != "delivered" || x.ReceiptAcked {
		t.Errorf("ref-x: %+v", x)
	}
	if y := d["ref-y"]; y.Fate != "" || y.ReceiptAcked || y.Deliveries != 1 {
		t.Errorf("ref-y: %+v", y)
	}
	if st := s.Stats(); st.ReceiptFailures != receiptTries || st.ReceiptsSent != 0 {
		t.Errorf("stats %+v", st)
	}
}

// A receipt lost (ReceiptLossRate): the message's fate is decided and a
// lookup shows it, but no receipt is ever sent; counted.
func TestReceiptLost(t *testing.T) {
	t.Parallel()
	k := newSink(t)
	s := newStub(t, Config{IgnoreKeys: true, Faults: Faults{ReceiptLossRate: 1},
		Receipts: Receipts{Secret: testSecret, Delay: time.Millisecond}})
	body := `{"to":"+15550000001","body":"hi","reference":"ref-l","callback_url":"` + k.url + `/v1/receipts/generic"}`
	if r, err := post(context.Background(), s.client, s.url, "ref-l", body); err != nil || r.status != 201 {
		t.Fatalf("post: %v %v", r.status, err)
	}
	testkit.WaitFor(t, 10*time.Second, "the fate decided", func() bool {
		_, got := lookup(t, s, "ref-l")
		return len(got.Messages) == 1 && got.Messages[0].Status == "delivered"
	})
	if st := s.Stats(); st.ReceiptsLost != 1 || st.ReceiptsSent != 0 || len(k.got()) != 0 {
		t.Fatalf("stats %+v, receipts %v; want the receipt lost, none sent", st, k.got())
	}
	if d := s.Deliveries()["ref-l"]; d.Fate != "delivered" || d.ReceiptAcked {
		t.Fatalf("ref-l: %+v", d)
	}
}

// Faults of the evidence: a lookup that fails, a request lost before it is
// taken (nothing delivered, nothing to look up).
func TestLookupFailureAndDrop(t *testing.T) {
	t.Parallel()
	s := newStub(t, Config{IgnoreKeys: true, Faults: Faults{DropRate: 1, LookupFailRate: 1}})
	ctx := context.Background()
	if _, err := post(ctx, s.client, s.url, "k", `{"to":"+15550000001","body":"hi","reference":"ref-d"}`); err == nil {
		t.Fatal("a dropped request got an answer")
	}
	if code, _ := lookup(t, s, "ref-d"); code != 500 {
		t.Fatalf("lookup with LookupFailRate 1: %d, want 500", code)
	}
	if err := s.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if code, got := lookup(t, s, "ref-d"); code != 200 || len(got.Messages) != 0 {
		t.Fatalf("lookup of a dropped request: %d %+v, want none", code, got)
	}
	if st := s.Stats(); st.Dropped != 1 || st.Deliveries != 0 || st.LookupFailures != 1 {
		t.Errorf("stats %+v", st)
	}
}

// Receipts reuse kept-alive connections: waves of concurrent receipts to
// one callback host open about one wave's worth of connections in all, not
// one per receipt beyond Go's default two idle connections per host.
func TestReceiptsReuseConnections(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	opened, got := 0, 0
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(20 * time.Millisecond) // keep the wave's receipts in flight together
		mu.Lock()
		got++
		mu.Unlock()
	}))
	ts.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			mu.Lock()
			opened++
			mu.Unlock()
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)
	s := newStub(t, Config{Receipts: Receipts{Secret: testSecret, Delay: time.Millisecond}})
	const waves, wave = 4, 40
	for w := range waves {
		var wg sync.WaitGroup
		for i := range wave {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("k-%d-%d", w, i)
				body := `{"to":"+15550000001","body":"hi","reference":"` + key + `","callback_url":"` + ts.URL + `/v1/receipts/generic"}`
				if r, err := post(context.Background(), s.client, s.url, key, body); err != nil || r.status != http.StatusCreated {
					t.Errorf("post: %d %v", r.status, err)
				}
			}()
		}
		wg.Wait()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			n := got
			mu.Unlock()
			if n == (w+1)*wave {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("wave %d: %d of %d receipts arrived", w, n, (w+1)*wave)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// Without keep-alive beyond two idle connections every wave after the
	// first opens about wave-2 new ones: about 150 here.
	if opened > wave+wave/2 {
		t.Fatalf("%d receipts opened %d connections; want about %d (one wave), reused after", waves*wave, opened, wave)
	}
	t.Logf("%d receipts over %d connections", waves*wave, opened)
}
