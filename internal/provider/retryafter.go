package provider

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// parseRetryAfter reads a Retry-After value: delta-seconds or an HTTP-date.
// It returns 0 when the value is absent or garbage (the caller's schedule
// applies), 1ms for a date in the past ("now"), and at most ceiling.
func parseRetryAfter(v string, now time.Time, ceiling time.Duration) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if isDigits(v) {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > int64(ceiling/time.Second) {
			return ceiling // too large to represent: the provider means "long"
		}
		if secs == 0 {
			return time.Millisecond
		}
		return time.Duration(secs) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	d := t.Sub(now)
	switch {
	case d <= 0:
		return time.Millisecond
	case d > ceiling:
		return ceiling
	}
	return d
}

func isDigits(s string) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
