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
type sessions struct {
	mu  sync.Mutex
	m   map[string]*session
	ttl time.Duration
	max int
}

func newSessions(ttl time.Duration, max int) *sessions {
	return &sessions{m: map[string]*session{}, ttl: ttl, max: max}
}

func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// create starts a session for u, dropping expired ones, and the oldest
// when the store is full.
func (s *sessions) create(u User, now time.Time) *session {
	sess := &session{token: randomToken(), user: u, csrf: randomToken(), expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) >= s.max {
		var oldest *session
		for k, v := range s.m {
			if now.After(v.expires) {
				delete(s.m, k)
			} else if oldest == nil || v.expires.Before(oldest.expires) {
				oldest = v
			}
		}
		if len(s.m) >= s.max && oldest != nil {
			delete(s.m, oldest.token)
		}
	}
	s.m[sess.token] = sess
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
		delete(s.m, c.Value)
		return nil
	}
	return sess
}

func (s *sessions) end(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, token)
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
// times (with any names), or a user's name loginSuspect times (from any
// addresses), within loginForget of each other, the pairs of that address
// or that name wait from their first failure.
type limiter struct {
	mu    sync.Mutex
	addrs map[string]*addrStrikes
	// names counts the failures of known users' names, from every address
	// (a table as long as the users file).
	names map[string]*strikes
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
)

func newLimiter() *limiter {
	return &limiter{addrs: map[string]*addrStrikes{}, names: map[string]*strikes{}}
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
	a := l.addrs[addr]
	if a == nil {
		a = &addrStrikes{names: map[string]*strikes{}}
		l.addrs[addr] = a
	}
	a.count(now)
	suspect := a.fails >= loginSuspect
	if known {
		n := l.names[name]
		if n == nil {
			n = &strikes{}
			l.names[name] = n
		}
		n.count(now)
		suspect = suspect || n.fails >= loginSuspect
	}
	p := a.names[name]
	if p == nil {
		p = &strikes{}
		a.names[name] = p
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
	if a := l.addrs[addr]; a != nil {
		delete(a.names, name)
	}
}

// dummyHash is compared against when the user name is unknown, so a wrong
// name takes as long as a wrong password.
var dummyHash = sync.OnceValue(func() []byte {
	h, _ := bcrypt.GenerateFromPassword([]byte("no such user; this hash only spends time"), MinCost)
	return h
})

// authenticate checks a name and a password against users.
func authenticate(users map[string]User, name, password string) (User, bool) {
	u, ok := users[name]
	hash := u.Hash
	if !ok {
		hash = dummyHash()
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || !ok {
		return User{}, false
	}
	return u, true
}
