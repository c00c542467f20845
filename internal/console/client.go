package console

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ParseTrustedProxies reads the proxies whose X-Forwarded-For the console
// believes: addresses and CIDR prefixes, separated by commas or spaces. An
// error quotes the entry that does not parse.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		if strings.Contains(f, "/") {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return nil, fmt.Errorf("%q is not an address or a CIDR prefix", f)
			}
			if p.Addr().Is4In6() {
				p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("%q is not an address or a CIDR prefix", f)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// trusted reports whether a is one of the trusted proxies.
func (c *Console) trusted(a netip.Addr) bool {
	for _, p := range c.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientAddr is the address of the client that sent r: the direct peer,
// unless that is a trusted proxy; then the right-most address of
// X-Forwarded-For that is not a trusted proxy (what the client wrote
// itself stands to the left of what the proxies appended, and is never
// believed). The zero Addr when the peer's address does not parse.
func (c *Console) clientAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	addr := ap.Addr().Unmap().WithZone("")
	if len(c.cfg.TrustedProxies) == 0 || !c.trusted(addr) {
		return addr
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		h := strings.TrimSpace(hops[i])
		if h == "" {
			continue
		}
		a, err := netip.ParseAddr(h)
		if err != nil {
			ap, perr := netip.ParseAddrPort(h)
			if perr != nil {
				// Not an address: the hop that passed it on is as far
				// as the chain can be followed.
				return addr
			}
			a = ap.Addr()
		}
		a = a.Unmap().WithZone("")
		if !c.trusted(a) {
			return a
		}
		addr = a
	}
	return addr
}

// remote is the client's address for the logs and the audit.
func (c *Console) remote(r *http.Request) string {
	if a := c.clientAddr(r); a.IsValid() {
		return a.String()
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// throttleKey is the address failed logins count against: an IPv4
// address, or an IPv6 address's /64 (what one subscriber gets).
func (c *Console) throttleKey(r *http.Request) string {
	a := c.clientAddr(r)
	switch {
	case !a.IsValid():
		return c.remote(r)
	case a.Is4():
		return a.String()
	default:
		p, _ := a.Prefix(64)
		return p.String()
	}
}
