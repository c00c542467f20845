package outbox_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// db is a migrated database shared by the tests and the examples, which
// read its URL from DATABASE_URL as an application would.
var db *pgxpool.Pool

func TestMain(m *testing.M) {
	url, drop := pgtest.NewMigratedForMain()
	os.Setenv("DATABASE_URL", url)
	var err error
	if db, err = pgxpool.New(context.Background(), url); err != nil {
		panic(err)
	}
	testkit.Main(m, db.Close, drop)
}
