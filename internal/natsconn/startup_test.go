package natsconn_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/testing/embednats"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// A broker that is down when the process starts is connected to in the
// background: Connect succeeds, WaitConnected returns once the broker is up.
// Before, Connect failed and the process exited into a crash loop.
func TestConnectWaitsForABrokerThatIsDownAtStartUp(t *testing.T) {
	t.Parallel()
	port := testport.Reserve(t)
	nc, _, err := natsconn.Connect(natsconn.Config{URL: "nats://127.0.0.1:" + strconv.Itoa(port), ConnectTimeout: time.Second})
	if err != nil {
		t.Fatalf("Connect with the broker down: %v", err)
	}
	defer nc.Close()
	if nc.IsConnected() {
		t.Fatal("connected to a broker that is not running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = natsconn.WaitConnected(ctx, nc, nil)
	cancel()
	if err == nil {
		t.Fatal("WaitConnected returned without a broker")
	}
	srv, err := embednats.Start(embednats.Config{Port: port, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := natsconn.WaitConnected(ctx, nc, nil); err != nil {
		t.Fatalf("WaitConnected after the broker started: %v", err)
	}
}
