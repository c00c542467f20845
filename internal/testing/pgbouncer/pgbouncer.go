// Package pgbouncer runs a throwaway PgBouncer in front of a Postgres
// server, from the machine's pgbouncer binary (Debian's package): for the
// tests that prove the processes work behind a connection pooler.
//
// PgBouncer refuses to run as root; a caller that is root has it switch to
// the postgres user (its -u option), and hands it its directory.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sendonce/sendonce/internal/proc"
)

// Modes of Config.Mode: PgBouncer's pool_mode.
const (
	Session     = "session"
	Transaction = "transaction"
)

// Config configures a Bouncer.
type Config struct {
	// Upstream is the Postgres server's host:port; required.
	Upstream string
	// Mode is the pool mode, Session or Transaction; required.
	Mode string
	// Users may connect through it (authentication is trust: the server
	// behind it authenticates nothing either, in tests); default postgres.
	Users []string
	// Port is the port it listens on, on 127.0.0.1; required.
	Port int
	// PoolSize is the server connections per database and user; default 20.
	PoolSize int
	// IgnoreStartupParameters lists startup parameters it accepts and
	// drops instead of refusing the connection.
	IgnoreStartupParameters []string
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	cfg  Config
	dir  string
	proc *proc.Process
}

// Bin returns the pgbouncer binary, or an error when none is installed.
func Bin() (string, error) {
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	return "", errors.New("pgbouncer: no pgbouncer binary on this machine (Debian: apt-get install pgbouncer)")
}

// Start writes the configuration into a new directory and starts PgBouncer,
// and returns once it accepts connections.
func Start(ctx context.Context, cfg Config) (*Bouncer, error) {
	bin, err := Bin()
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.Upstream == "" || cfg.Port == 0:
		return nil, errors.New("pgbouncer: Upstream and Port are required")
	case cfg.Mode != Session && cfg.Mode != Transaction:
		return nil, fmt.Errorf("pgbouncer: Mode %q is not session or transaction", cfg.Mode)
	}
	if len(cfg.Users) == 0 {
		cfg.Users = []string{"postgres"}
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 20
	}
	host, port, err := net.SplitHostPort(cfg.Upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: Upstream: %w", err)
	}
	dir, err := os.MkdirTemp("", "sendonce-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	b := &Bouncer{cfg: cfg, dir: dir}
	var users strings.Builder
	for _, u := range cfg.Users {
		fmt.Fprintf(&users, "%q \"\"\n", u)
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
max_client_conn = 1000
default_pool_size = %d
ignore_startup_parameters = %s
server_reset_query = DISCARD ALL
`, host, port, cfg.Port, filepath.Join(dir, "users.txt"), cfg.Mode, cfg.PoolSize, strings.Join(cfg.IgnoreStartupParameters, ","))
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(users.String()), 0o644); err != nil {
		return nil, b.fail(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, b.fail(err)
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, b.fail(fmt.Errorf("running as root needs a postgres user to run pgbouncer as: %w", err))
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, b.fail(err)
		}
		args = append([]string{"-u", "postgres"}, args...)
	}
	b.proc, err = proc.Start(proc.Spec{Name: "pgbouncer", Path: bin, Args: args, LogFile: filepath.Join(dir, "pgbouncer.log")})
	if err != nil {
		return nil, b.fail(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			c.Close()
			return b, nil
		}
		select {
		case <-b.proc.Done():
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			return nil, b.fail(fmt.Errorf("exited: %v\n%s", b.proc.Err(), log))
		case <-ctx.Done():
			b.Stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Stop()
			return nil, errors.New("pgbouncer: not listening after 30s")
		}
	}
}

func (b *Bouncer) fail(err error) error {
	_ = os.RemoveAll(b.dir)
	return fmt.Errorf("pgbouncer: %w", err)
}

// Addr is the address PgBouncer listens on.
func (b *Bouncer) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.cfg.Port) }

// URL is the URL of database db through PgBouncer, as user.
func (b *Bouncer) URL(user, db string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", user, b.Addr(), db)
}

// Stop stops PgBouncer and removes its directory.
func (b *Bouncer) Stop() {
	if b.proc != nil {
		b.proc.Stop(syscall.SIGTERM, 10*time.Second)
	}
	_ = os.RemoveAll(b.dir)
}
