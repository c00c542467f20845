package sender

import (
	"time"

	"github.com/sendonce/sendonce/internal/backoff"
)

// Backoff returns the full-jitter delay before the attempt after attempt
// number attempt (counting from 1): U(0, min(cap, base*2^attempt)), never
// 0 (backoff.Full). SMS_RETRY_BASE and SMS_RETRY_CAP set base and cap.
func Backoff(attempt int, base, cap time.Duration) time.Duration {
	return backoff.Full(attempt, base, cap)
}
