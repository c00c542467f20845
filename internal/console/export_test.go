package console

// ThrottleSize returns how many addresses, (name, address) pairs and
// names the login throttle holds.
func (c *Console) ThrottleSize() (addrs, pairs, names int) { return c.limiter.size() }
