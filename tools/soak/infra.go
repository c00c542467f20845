package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/testing/embednats"
)

// recreateDatabase drops the database named in dsn (closing its sessions)
// and creates it empty.
func recreateDatabase(ctx context.Context, dsn string) error {
	u, err := url.Parse(dsn)
	if err != nil {
		return err
	}
	name := u.Path[1:]
	u.Path = "/postgres"
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, u.String())
	if err != nil {
		return fmt.Errorf("connect to the maintenance database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(cctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	if _, err := conn.Exec(cctx, "CREATE DATABASE "+ident); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// migrate runs "relay migrate" against the database.
func (s *soak) migrate(ctx context.Context) error {
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := proc.Run(mctx, filepath.Join(s.cfg.binDir, "relay"), []string{"migrate"},
		[]string{"DATABASE_URL=" + s.directURL, "LOG_FORMAT=text"})
	if err != nil {
		return err
	}
	_ = os.WriteFile(filepath.Join(s.logDir, "migrate.log"), out, 0o644)
	return nil
}

func newPool(ctx context.Context, dsn string, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(maxConns)
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(pctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return pool, nil
}

// broker is the embedded NATS server, stopped and started again on the
// same port and store by the broker_restart fault.
type broker struct {
	mu   sync.Mutex
	dir  string
	port int
	srv  *server.Server
}

func startBroker(dir string) (*broker, error) {
	srv, err := embednats.Start(embednats.Config{StoreDir: dir})
	if err != nil {
		return nil, err
	}
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		srv.Shutdown()
		return nil, errors.New("nats: no listen address")
	}
	return &broker{dir: dir, port: addr.Port, srv: srv}, nil
}

func (b *broker) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", b.port) }

// stop shuts the server down; a no-op when it is down.
func (b *broker) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv != nil {
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
		b.srv = nil
	}
}

// start starts the server on its port and store; a no-op when it runs.
func (b *broker) start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv != nil {
		return nil
	}
	var err error
	for try := 0; try < 5; try++ {
		var srv *server.Server
		if srv, err = embednats.Start(embednats.Config{Port: b.port, StoreDir: b.dir}); err == nil {
			b.srv = srv
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("restart nats on port %d: %w", b.port, err)
}

// tcpProxy is an in-process toxiproxy in front of one upstream, like
// internal/testing/toxictest but without a testing.TB.
type tcpProxy struct {
	mu     sync.Mutex
	proxy  *toxiproxy.Proxy
	toxics map[string]bool
}

func newTCPProxy(name, upstream string) (*tcpProxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	// Listen now holds the real port, so a disabled proxy comes back on it.
	return &tcpProxy{proxy: p, toxics: map[string]bool{}}, nil
}

func (p *tcpProxy) addr() string { return p.proxy.Listen }

func (p *tcpProxy) url() string { return "http://" + p.addr() }

// addToxic adds a toxic on stream ("upstream": client to server,
// "downstream": server to client) to every connection, present and future.
func (p *tcpProxy) addToxic(name, typ, stream string, attrs map[string]any) error {
	body, _ := json.Marshal(map[string]any{
		"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs,
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.proxy.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		return fmt.Errorf("add toxic %s: %w", name, err)
	}
	p.toxics[name] = true
	return nil
}

func (p *tcpProxy) removeToxic(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.toxics[name] {
		return nil
	}
	delete(p.toxics, name)
	if err := p.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		return fmt.Errorf("remove toxic %s: %w", name, err)
	}
	return nil
}

// disable closes the listener and every connection through the proxy.
func (p *tcpProxy) disable() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proxy.Stop()
}

// enable listens again on the same address; a no-op when enabled.
func (p *tcpProxy) enable() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	for try := 0; try < 10; try++ {
		if err = p.proxy.Start(); err == nil || errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("re-enable proxy on %s: %w", p.addr(), err)
}

// restore removes every toxic and enables the proxy.
func (p *tcpProxy) restore() error {
	p.mu.Lock()
	names := make([]string, 0, len(p.toxics))
	for n := range p.toxics {
		names = append(names, n)
	}
	p.mu.Unlock()
	var errs []error
	for _, n := range names {
		if err := p.removeToxic(n); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.enable(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (p *tcpProxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proxy.Stop()
}
