package sender

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/breaker"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/streams"
)

// Route is one provider of an ordered failover list (SMS_PROVIDERS).
type Route struct {
	// Name is the provider's name, recorded in the rows it may hold and in
	// their attempts.
	Name string
	// Provider calls it.
	Provider Provider
	// Breaker, when set, replaces the route's default circuit (tests).
	Breaker *breaker.Breaker
}

// route is a Route with its circuit and its place in the sender's list.
type route struct {
	Route
	br *breaker.Breaker
	at int
}

// routes returns the sender's routes: Config.Routes, or the one provider
// of Config.Provider, unnamed.
func (s *Sender) initRoutes() {
	rs := s.cfg.Routes
	if len(rs) == 0 {
		rs = []Route{{Provider: s.cfg.Provider}}
	}
	for _, r := range rs {
		br := r.Breaker
		if br == nil {
			name := r.Name
			br = breaker.New(breaker.Config{OnChange: func(st breaker.State) {
				s.metrics.providerState.WithLabelValues(name).Set(float64(st))
				s.log.Warn("provider circuit changed", "provider", name, "state", st.String())
			}})
		}
		s.routes = append(s.routes, &route{Route: r, br: br, at: len(s.routes)})
		if r.Name != "" {
			s.metrics.providerState.WithLabelValues(r.Name).Set(float64(br.State()))
		}
	}
}

// route returns the route of the provider a row names; the first for a
// row that names none; nil for a provider this sender does not have.
func (s *Sender) route(name string) *route {
	if name == "" {
		return s.routes[0]
	}
	for _, r := range s.routes {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// failover reports whether the sender has providers to move rows between.
func (s *Sender) failover() bool { return len(s.routes) > 1 }

// providers names the providers a claim gives rows that have none: the
// first whose circuit takes calls now, and the first of all.
func (s *Sender) providers() outbox.Providers {
	if s.routes[0].Name == "" {
		return outbox.Providers{}
	}
	p := outbox.Providers{Preferred: s.routes[0].Name, Primary: s.routes[0].Name}
	for _, r := range s.routes {
		if r.br.Ready() {
			p.Preferred = r.Name
			break
		}
	}
	return p
}

// alternative returns the first route after from whose circuit takes calls
// now, or nil.
func (s *Sender) alternative(from *route) *route {
	for _, r := range s.routes {
		if r != from && r.br.Ready() {
			return r
		}
	}
	return nil
}

// repin moves a claimed row to another provider before it is called
// there; it reports false (and the row stays) when the write did not
// apply or failed.
func (s *Sender) repin(ctx context.Context, c outbox.Claim, from, to *route) bool {
	dbCtx, cancel := context.WithTimeout(ctx, s.cfg.DBTimeout)
	defer cancel()
	ok, err := outbox.Repin(dbCtx, s.cfg.Pool, c.ID, c.Token, from.Name, to.Name)
	if err != nil {
		s.log.Warn("could not move a row to another provider; it stays", "outbox_id", c.ID.String(), "from", from.Name, "to", to.Name, "err", err)
		return false
	}
	if ok {
		s.metrics.failovers.WithLabelValues(from.Name, to.Name).Inc()
	}
	return ok
}

// notTaken reports whether an attempt certainly left the message with the
// provider untaken, so that another provider may be called: the request
// never left (connection refused, DNS, TLS), or an answer the provider's
// contract says takes nothing (provider.Client.NotTaken: a 503 of the
// generic API). A 429 is flow control: the row waits for the same
// provider.
func notTaken(p Provider, o provider.Outcome) bool {
	if t, ok := p.(interface{ NotTaken(provider.Outcome) bool }); ok {
		return t.NotTaken(o)
	}
	return o.Kind == provider.Retry && !o.MaybeAccepted && o.HTTPStatus == 0
}

// healthy reports what an attempt says of its provider's health, for its
// circuit: any answer but a 5xx is a working provider's, whatever it said
// of the message; no answer, or a 5xx, is a failure.
func healthy(o provider.Outcome) bool {
	return o.HTTPStatus != 0 && o.HTTPStatus < 500
}

func providerMetrics(m *metrics) []prometheus.Collector {
	m.providerState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sendonce_sender_provider_circuit",
		Help: "Each provider's circuit as this sender sees it: 0 closed, 1 half-open (probing), 2 open (new messages go to the next provider).",
	}, []string{"provider"})
	m.providerCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sendonce_sender_provider_calls_total",
		Help: "Provider calls by provider and outcome class, with SMS_PROVIDERS: each provider's share.",
	}, []string{"provider", "outcome"})
	m.failovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sendonce_sender_failovers_total",
		Help: "Messages moved from one provider to the next, which had certainly not taken them (the request never left, a 503, or its circuit open).",
	}, []string{"from", "to"})
	return []prometheus.Collector{m.providerState, m.providerCalls, m.failovers}
}

// Circuits reports each named provider's circuit state (closed, half-open,
// open); nil for a sender whose one provider has no name.
func (s *Sender) Circuits() map[string]string {
	if s.routes[0].Name == "" {
		return nil
	}
	out := make(map[string]string, len(s.routes))
	for _, r := range s.routes {
		out[r.Name] = r.br.State().String()
	}
	return out
}

// lanePreference returns the provider the lane of a message published on
// subject prefers, while its circuit takes calls; "" otherwise.
func (s *Sender) lanePreference(subject string) string {
	lane := "normal"
	for _, l := range streams.Lanes {
		if subject == l.Subject {
			lane = l.Name
		}
	}
	name := s.cfg.LaneProviders[lane]
	if r := s.route(name); name != "" && r != nil && r.br.Ready() {
		return name
	}
	return ""
}
