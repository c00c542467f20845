package console

import (
	"time"

	"golang.org/x/crypto/bcrypt"
)

// ThrottleSize returns how many addresses, (name, address) pairs and
// names the login throttle holds.
func (c *Console) ThrottleSize() (addrs, pairs, names int) { return c.limiter.size() }

// DummyHashCost is the bcrypt cost of the hash an unknown name is
// compared against.
func (c *Console) DummyHashCost() int {
	cost, err := bcrypt.Cost(c.dummy)
	if err != nil {
		panic(err)
	}
	return cost
}

// Sessions returns how many sessions the console holds, and how many of
// them are user's.
func (c *Console) Sessions(user string) (all, users int) { return c.sessions.size(user) }

// SetNow replaces the console's clock; call it before the first request.
func (c *Console) SetNow(now func() time.Time) { c.now = now }
