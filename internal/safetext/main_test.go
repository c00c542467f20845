package safetext

import (
	"testing"

	"github.com/sendonce/sendonce/internal/testkit"
)

// TestMain fails the package if a test leaks a goroutine.
func TestMain(m *testing.M) { testkit.Main(m) }
