package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// cookieName names the session cookie.
const cookieName = "sendonce_console"

// session is a logged-in user: the cookie holds a random token that names
// it, and its CSRF token goes into every form.
type session struct {
	token   string
	user    User
	csrf    string
	expires time.Time
}

// sessions are kept in memory: a restart logs everyone out, and so does
// reaching another console process (run one, or route a user to one).
//
// The store is bounded two ways. A user holds at most perUser sessions:
// a new login past that ends the user's oldest. The store holds at most
// max: a new login past that ends the oldest session of the user who
// holds the most, so nobody's logins can push out everyone else's.
// Expired sessions are swept at least once a minute.
type sessions struct {
	mu      sync.Mutex
	m       map[string]*session
	byUser  map[string]map[string]*session
	ttl     time.Duration
	max     int
	perUser int
	swept   time.Time
}

const sessionSweepGap = time.Minute

func newSessions(ttl time.Duration, max, perUser int) *sessions {
	return &sessions{m: map[string]*session{}, byUser: map[string]map[string]*session{}, ttl: ttl, max: max, perUser: perUser}
}

func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// drop removes a session; s.mu is held.
func (s *sessions) drop(sess *session) {
	delete(s.m, sess.token)
	mine := s.byUser[sess.user.Name]
	delete(mine, sess.token)
	if len(mine) == 0 {
		delete(s.byUser, sess.user.Name)
	}
}

// sweep drops the expired sessions; s.mu is held.
func (s *sessions) sweep(now time.Time) {
	s.swept = now
	for _, sess := range s.m {
		if now.After(sess.expires) {
			s.drop(sess)
		}
	}
}

// dropOldest ends the oldest session of a user's; s.mu is held.
func (s *sessions) dropOldest(mine map[string]*session) {
	var oldest *session
	for _, sess := range mine {
		if oldest == nil || sess.expires.Before(oldest.expires) {
			oldest = sess
		}
	}
	if oldest != nil {
		s.drop(oldest)
	}
}

// create starts a session for u, making room as the type describes.
func (s *sessions) create(u User, now time.Time) *session {
	sess := &session{token: randomToken(), user: u, csrf: randomToken(), expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.swept) > sessionSweepGap || len(s.m) >= s.max {
		s.sweep(now)
	}
	for len(s.byUser[u.Name]) >= s.perUser {
		s.dropOldest(s.byUser[u.Name])
	}
	for len(s.m) >= s.max {
		var most map[string]*session
		for _, mine := range s.byUser {
			if len(mine) > len(most) {
				most = mine
			}
		}
		s.dropOldest(most)
	}
	s.m[sess.token] = sess
	if s.byUser[u.Name] == nil {
		s.byUser[u.Name] = map[string]*session{}
	}
	s.byUser[u.Name][sess.token] = sess
	return sess
}

// get returns the live session the request's cookie names, or nil.
func (s *sessions) get(r *http.Request, now time.Time) *session {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.m[c.Value]
	if sess == nil {
		return nil
	}
	if now.After(sess.expires) {
		s.drop(sess)
		return nil
	}
	return sess
}

func (s *sessions) end(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess := s.m[token]; sess != nil {
		s.drop(sess)
	}
}

// endOthers ends every session of keep's user but keep, and returns how
// many it ended.
func (s *sessions) endOthers(keep *session) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sess := range s.byUser[keep.user.Name] {
		if sess.token != keep.token {
			s.drop(sess)
			n++
		}
	}
	return n
}

// evictName drops the name that is not a user's with the fewest
// failures (a stale one first), so that flooding the table with new
// names does not erase a name's count cheaply; false if every name is a
// user's.
func (l *limiter) evictName(now time.Time) bool {
	var victim string
	var vs *strikes
	for n, s := range l.names {
		if l.known[n] {
			continue
		}
		if vs == nil || s.stale(now) && !vs.stale(now) ||
			s.stale(now) == vs.stale(now) && (s.fails < vs.fails || s.fails == vs.fails && s.last.Before(vs.last)) {
			victim, vs = n, s
		}
	}
	if vs == nil {
		return false
	}
	delete(l.names, victim)
	return true
}

// size returns how many sessions the store holds, and how many of them
// are user's.
func (s *sessions) size(user string) (all, users int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m), len(s.byUser[user])
}

// validCSRF reports whether the form's csrf field is the session's token.
func (sess *session) validCSRF(r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) == 1
}

// limiter slows down password guessing. Failures count per pair of a name
// and a client address: after loginFree of them, each further try of that
// name from that address waits twice as long as the last, 2 s up to a
// quarter of an hour; a success clears the pair. Nothing else refuses a
// login: a name's failures from other addresses, or an address's failures
// with other names, never make a name wait at an address where it has not
// failed, so a stranger cannot lock an operator out, whether from
// elsewhere or from behind the same proxy. They only make guessing
// costlier where it goes on: once an address has failed loginSuspect
// times (with any names), or a name loginSuspect times (from any
// addresses), within loginForget of each other, the pairs of that address
// or that name wait from their first failure.
//
// Its tables are bounded: a name is checked against the users file's
// pattern before it gets here; an address keeps the pairs of at most
// maxPerAddr names, the whole table at most maxEntries pairs and
// addresses, the per-name counts at most maxNames names besides the
// users', and entries silent for loginForget are swept away. When a
// table is full the entry that goes is the least penalized one, the one
// whose wait ends first (a stale one before all): evicting a pair only
// ever lets its name try again sooner, so to get rid of a penalty by
// flooding, a guesser must first fill the table with entries penalized
// longer than it.
type limiter struct {
	mu    sync.Mutex
	addrs map[string]*addrStrikes
	// names counts the failures of each name, from every address: a
	// user's name is kept until it is stale, other names (which count
	// alike, so that the throttle does not tell which names exist) at
	// most maxNames of them.
	names map[string]*strikes
	known map[string]bool
	// pairs is how many pairs the addresses hold.
	pairs      int
	maxPerAddr int
	maxEntries int
	maxNames   int
	swept      time.Time
}

// addrStrikes are an address's failures, with any name, and those of each
// name it failed with.
type addrStrikes struct {
	strikes
	names map[string]*strikes
}

type strikes struct {
	fails int
	until time.Time
	last  time.Time
}

const (
	loginFree     = 5
	loginSuspect  = 20
	loginFirstGap = 2 * time.Second
	loginMaxGap   = 15 * time.Minute
	loginForget   = time.Hour
	// loginPerAddr and loginEntries bound the throttle's table: some
	// 200 bytes an entry, so 4 MB at most.
	loginPerAddr  = 64
	loginEntries  = 20_000
	loginNames    = 4_096
	loginSweepGap = time.Minute
)

func newLimiter() *limiter {
	return &limiter{addrs: map[string]*addrStrikes{}, names: map[string]*strikes{}, known: map[string]bool{},
		maxPerAddr: loginPerAddr, maxEntries: loginEntries, maxNames: loginNames}
}

// stale reports whether s has been silent for loginForget (its wait, at
// most loginMaxGap, is over by then).
func (s *strikes) stale(now time.Time) bool { return now.Sub(s.last) > loginForget }

// sweep drops the stale entries.
func (l *limiter) sweep(now time.Time) {
	l.swept = now
	for k, a := range l.addrs {
		for n, p := range a.names {
			if p.stale(now) {
				delete(a.names, n)
				l.pairs--
			}
		}
		if len(a.names) == 0 && a.stale(now) {
			delete(l.addrs, k)
		}
	}
	for n, s := range l.names {
		if s.stale(now) {
			delete(l.names, n)
			delete(l.known, n)
		}
	}
}

// penalty orders entries for eviction: a stale entry first, then the one
// whose wait ends first, then the one that failed longest ago.
func penalty(s *strikes, now time.Time) (bool, time.Time, time.Time) {
	return !s.stale(now), s.until, s.last
}

func lessPenalized(a, b *strikes, now time.Time) bool {
	al, au, at := penalty(a, now)
	bl, bu, bt := penalty(b, now)
	if al != bl {
		return !al
	}
	if !au.Equal(bu) {
		return au.Before(bu)
	}
	return at.Before(bt)
}

// evictFrom drops the least penalized pair of a.
func (l *limiter) evictFrom(a *addrStrikes, now time.Time) {
	var victim string
	var vs *strikes
	for n, p := range a.names {
		if vs == nil || lessPenalized(p, vs, now) {
			victim, vs = n, p
		}
	}
	if vs != nil {
		delete(a.names, victim)
		l.pairs--
	}
}

// evict drops the least penalized pair of the whole table, with its
// address if that has no pair left; an address without pairs goes first.
func (l *limiter) evict(now time.Time) {
	var va string
	var vs *strikes
	for k, a := range l.addrs {
		if len(a.names) == 0 {
			delete(l.addrs, k)
			return
		}
		for _, p := range a.names {
			if vs == nil || lessPenalized(p, vs, now) {
				va, vs = k, p
			}
		}
	}
	if vs == nil {
		return
	}
	a := l.addrs[va]
	for n, p := range a.names {
		if p == vs {
			delete(a.names, n)
			l.pairs--
		}
	}
	if len(a.names) == 0 {
		delete(l.addrs, va)
	}
}

// size returns how many addresses, pairs and names the tables hold.
func (l *limiter) size() (addrs, pairs, names int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.addrs), l.pairs, len(l.names)
}

// count records a failure at now; a count silent for loginForget starts
// over.
func (s *strikes) count(now time.Time) {
	if now.Sub(s.last) > loginForget {
		*s = strikes{}
	}
	s.fails++
	s.last = now
}

// wait returns how long name must wait before its next try from addr (0:
// now).
func (l *limiter) wait(name, addr string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.addrs[addr]
	if a == nil {
		return 0
	}
	p := a.names[name]
	if p == nil || !now.Before(p.until) {
		return 0
	}
	return p.until.Sub(now)
}

// fail records a failed login of name from addr; known says whether name
// is a user's.
func (l *limiter) fail(name, addr string, known bool, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > loginSweepGap {
		l.sweep(now)
	}
	a := l.addrs[addr]
	if a == nil || a.names[name] == nil {
		// A new entry: make room first.
		for l.pairs+len(l.addrs)+2 > l.maxEntries && len(l.addrs) > 0 {
			l.evict(now)
		}
		if a = l.addrs[addr]; a == nil {
			a = &addrStrikes{names: map[string]*strikes{}}
			l.addrs[addr] = a
		}
		if len(a.names) >= l.maxPerAddr {
			l.evictFrom(a, now)
		}
	}
	a.count(now)
	suspect := a.fails >= loginSuspect
	n := l.names[name]
	if n == nil {
		for len(l.names) >= l.maxNames && !known && l.evictName(now) {
		}
		n = &strikes{}
		l.names[name] = n
		if known {
			l.known[name] = true
		}
	}
	n.count(now)
	suspect = suspect || n.fails >= loginSuspect
	p := a.names[name]
	if p == nil {
		p = &strikes{}
		a.names[name] = p
		l.pairs++
	}
	p.count(now)
	free := loginFree
	if suspect {
		free = 1
	}
	if p.fails >= free {
		gap := loginFirstGap << min(p.fails-free, 20)
		p.until = now.Add(min(gap, loginMaxGap))
	}
}

// clear forgets the failures of name from addr, after its success there.
func (l *limiter) clear(name, addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.addrs[addr]; a != nil && a.names[name] != nil {
		delete(a.names, name)
		l.pairs--
	}
}

// dummyHash returns the hash compared against when a name is unknown, so
// that a wrong name takes as long as a wrong password: one of the highest
// cost among users (MinCost if none has a readable cost). Users of a
// lower cost answer faster than an unknown name; give every user the
// same cost (relay console user prints MinCost).
func dummyHash(users []User) []byte {
	cost := 0
	for _, u := range users {
		if c, err := bcrypt.Cost(u.Hash); err == nil {
			cost = max(cost, c)
		}
	}
	if cost == 0 {
		cost = MinCost
	}
	h, err := bcrypt.GenerateFromPassword([]byte("no such user; this hash only spends time"), cost)
	if err != nil {
		// Only a cost beyond bcrypt's range, which no hash has.
		panic(err)
	}
	return h
}

// authenticate checks a name and a password against users; dummy is
// dummyHash(users).
func authenticate(users map[string]User, dummy []byte, name, password string) (User, bool) {
	u, ok := users[name]
	hash := u.Hash
	if !ok {
		hash = dummy
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || !ok {
		return User{}, false
	}
	return u, true
}
