package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net"
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

// limiter slows down password guessing: after Free failed logins from one
// address, or for one user name, each further try waits twice as long as
// the last, up to a quarter of an hour. A success clears the name's count.
type limiter struct {
	mu sync.Mutex
	m  map[string]*strikes
}

type strikes struct {
	fails int
	until time.Time
	last  time.Time
}

const (
	loginFree     = 5
	loginFirstGap = 2 * time.Second
	loginMaxGap   = 15 * time.Minute
	loginForget   = time.Hour
	loginKeys     = 100_000
)

func newLimiter() *limiter { return &limiter{m: map[string]*strikes{}} }

// wait returns how long key must wait before its next try (0: now).
func (l *limiter) wait(key string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.m[key]
	if s == nil || !now.Before(s.until) {
		return 0
	}
	return s.until.Sub(now)
}

func (l *limiter) fail(key string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) >= loginKeys {
		for k, s := range l.m {
			if now.Sub(s.last) > loginForget {
				delete(l.m, k)
			}
		}
	}
	s := l.m[key]
	if s == nil || now.Sub(s.last) > loginForget {
		s = &strikes{}
		l.m[key] = s
	}
	s.fails++
	s.last = now
	if s.fails >= loginFree {
		gap := loginFirstGap << min(s.fails-loginFree, 20)
		s.until = now.Add(min(gap, loginMaxGap))
	}
}

func (l *limiter) clear(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
}

// remoteIP is the client's address as this process sees it (a proxy's
// forwarding headers are not trusted).
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
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
