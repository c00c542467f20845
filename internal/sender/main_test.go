package sender_test

import (
	"testing"

	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// TestMain fails the package if a test leaks a goroutine.
func TestMain(m *testing.M) { testkit.Main(m) }
