package console

import (
	"fmt"
	"html/template"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/outbox"
)

var funcs = template.FuncMap{
	"ts":      formatTime,
	"age":     formatAge,
	"num":     formatNum,
	"ms":      formatMs,
	"rate":    func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"percent": func(f float64) string { return strconv.FormatFloat(100*f, 'f', 0, 64) + " %" },
	"since": func(t, now time.Time) string {
		return formatAge(now.Sub(t))
	},
	"seq": func(p *int64) string {
		if p == nil {
			return "not stored yet"
		}
		if *p == 0 {
			return "stored (before sequences were tracked)"
		}
		return strconv.FormatInt(*p, 10)
	},
	"dash": func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	},
}

func formatMs(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// formatAge writes a duration the way a person reads an age: 850ms, 42s,
// 3m12s, 5h03m, 2d04h.
func formatAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return strconv.Itoa(int(d/time.Millisecond)) + "ms"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// formatNum writes n with thousands separators.
func formatNum(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// chart is the overview's bar chart of the last hour's attempts, one bar a
// minute, stacked by outcome, drawn as inline SVG.
type chart struct {
	Bars         []bar
	Max          int64
	From, To     time.Time
	Width, Plot  int
	Height       int
	Sent, Failed int64
	Retry        int64
}

type bar struct {
	X      int
	Counts outbox.MinuteAttempts
	Segs   []seg
	Title  string
}

type seg struct {
	Y, H  int
	Class string
}

const (
	chartMinutes = 60
	chartBarW    = 10
	chartPlotH   = 100
)

// newChart lays out the minutes from since on (a bucket's Minute is since
// plus whole minutes).
func newChart(since time.Time, minutes []outbox.MinuteAttempts) chart {
	c := chart{From: since, To: since.Add(chartMinutes * time.Minute), Width: chartMinutes * chartBarW, Plot: chartPlotH, Height: chartPlotH + 12}
	c.Bars = make([]bar, chartMinutes)
	for i := range c.Bars {
		c.Bars[i].X = i * chartBarW
		c.Bars[i].Counts.Minute = since.Add(time.Duration(i) * time.Minute)
	}
	for _, m := range minutes {
		i := min(chartMinutes-1, max(0, int((m.Minute.Sub(since)+time.Second)/time.Minute)))
		b := &c.Bars[i].Counts
		b.Sent += m.Sent
		b.Retry += m.Retry
		b.Failed += m.Failed
	}
	for _, b := range c.Bars {
		c.Max = max(c.Max, b.Counts.Sent+b.Counts.Retry+b.Counts.Failed)
		c.Sent += b.Counts.Sent
		c.Retry += b.Counts.Retry
		c.Failed += b.Counts.Failed
	}
	for i := range c.Bars {
		b := &c.Bars[i]
		y := chartPlotH
		for _, part := range []struct {
			n     int64
			class string
		}{{b.Counts.Sent, "sent"}, {b.Counts.Retry, "retry"}, {b.Counts.Failed, "failed"}} {
			if part.n == 0 || c.Max == 0 {
				continue
			}
			h := max(1, int(part.n*chartPlotH/c.Max))
			y -= h
			b.Segs = append(b.Segs, seg{Y: y, H: h, Class: part.class})
		}
		b.Title = fmt.Sprintf("%s: %d sent, %d retried, %d failed", b.Counts.Minute.UTC().Format("15:04"), b.Counts.Sent, b.Counts.Retry, b.Counts.Failed)
	}
	return c
}

// event is one line of a message's timeline.
type event struct {
	At   time.Time
	Kind string
	// Result is a receipt's or a lookup's result (delivered, found, ...).
	Result string
	Title  string
	Detail string
}

// timeline puts what is known of a message in time order: its creation,
// its attempts, the receipts and lookups recorded for it (at the time
// sendonce recorded them: a provider's own time may be skewed or missing),
// its dead letters, the console replays of it, and its status now. Events
// at the same instant keep that order, so an attempt comes before the
// lookup it led to.
func timeline(v messageView) []event {
	row := v.Row.Row
	evs := []event{{At: row.CreatedAt, Kind: "created", Title: "created",
		Detail: fmt.Sprintf("to %s, body of %d characters, at most %d attempts", row.ToMasked, row.BodyChars, row.MaxAttempts)}}
	for _, a := range v.Attempts {
		d := fmt.Sprintf("HTTP %d, provider code %d, %s", a.HTTPStatus, a.ProviderCode, formatMs(a.Latency))
		switch {
		case a.FromRow:
			d = "the provider took it at once; written at this time (the row records a first attempt that was sent, not its call)"
		case a.HTTPStatus == 0:
			d = "no answer from the provider, " + formatMs(a.Latency)
		}
		if a.Sender != "" {
			d += ", sender " + a.Sender
		}
		if a.Error != "" {
			d += ": " + a.Error
		}
		evs = append(evs, event{At: a.StartedAt, Kind: "attempt", Title: fmt.Sprintf("attempt %d: %s", a.Number, a.Outcome), Detail: d})
	}
	for _, e := range v.Evidence {
		evs = append(evs, evidenceEvent(e))
	}
	for _, l := range v.Letters {
		d := fmt.Sprintf("publish generation %d, attempts %d", l.Gen, l.Attempts)
		if l.ProviderCode != 0 {
			d += fmt.Sprintf(", provider code %d", l.ProviderCode)
		}
		if l.Error != "" {
			d += ": " + l.Error
		}
		evs = append(evs, event{At: l.Time, Kind: "letter", Title: fmt.Sprintf("dead letter %d: %s", l.Seq, l.Reason), Detail: d})
	}
	for _, r := range v.Replays {
		evs = append(evs, event{At: r.At, Kind: "replay", Title: "replayed from the console by " + r.User,
			Detail: fmt.Sprintf("back to pending with a new publish generation and the same idempotency key (audit record %d)", r.ID)})
	}
	slices.SortStableFunc(evs, func(a, b event) int { return a.At.Compare(b.At) })
	evs = append(evs, event{At: row.UpdatedAt, Kind: "status", Title: "now " + string(row.Status), Detail: "last change"})
	return evs
}

// evidenceEvent is a receipt's or a lookup's line of the timeline.
func evidenceEvent(e outbox.Evidence) event {
	ev := event{At: e.ReceivedAt, Kind: e.Kind, Result: e.Result}
	var parts []string
	switch e.Kind {
	case "receipt":
		ev.Title = "receipt: " + e.Result
		parts = append(parts, "from the provider ("+e.Source+")")
		if !e.ReportedAt.IsZero() {
			parts = append(parts, "reported at "+formatTime(e.ReportedAt))
		}
	default:
		ev.Title = "lookup: " + e.Result
		by := "asked by a sender"
		if e.Source == "resolve" {
			by = "asked by relay resolve"
		}
		parts = append(parts, by)
	}
	if e.ProviderRef != "" {
		parts = append(parts, "provider ref "+e.ProviderRef)
	}
	if e.Code != 0 {
		parts = append(parts, fmt.Sprintf("provider code %d", e.Code))
	}
	ev.Detail = strings.Join(parts, ", ")
	if e.Detail != "" {
		ev.Detail += ": " + e.Detail
	}
	return ev
}
