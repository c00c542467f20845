package outbox_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sendonce/sendonce/internal/pgtest"
)

func TestMain(m *testing.M) {
	// The example needs a database too; it gets one migrated for the run.
	url, cleanup := pgtest.NewMigratedForMain()
	os.Setenv("SENDONCE_EXAMPLE_DATABASE_URL", url)
	exampleDatabaseURL = url
	code := m.Run()
	cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
