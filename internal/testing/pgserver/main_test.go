package pgserver_test

import (
	"testing"

	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }
