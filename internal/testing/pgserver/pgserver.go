// Package pgserver runs throwaway PostgreSQL servers from the machine's
// server binaries (initdb, pg_ctl, pg_basebackup): for drills and tests that
// must stop, crash or promote a server, which the shared service on 5432
// cannot be made to do.
//
// Postgres refuses to run as root; a caller that is root runs the binaries
// as the postgres user, and the data directories are handed to it.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/sendonce/sendonce/internal/proc"
)

// FindBin returns the directory of the newest installed server binaries
// (/usr/lib/postgresql/N/bin), or the directory of initdb on PATH.
func FindBin() (string, error) {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return version(matches[i]) < version(matches[j]) })
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("pgserver: no PostgreSQL server binaries (initdb) on this machine")
}

func version(initdb string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return n
}

// Server is one PostgreSQL server: a data directory and a port.
type Server struct {
	// Bin is the directory of the server binaries.
	Bin string
	// Data is the data directory.
	Data string
	// Port is the TCP port on 127.0.0.1.
	Port int

	as []string // runuser prefix when running as root
}

// Options are the server settings a drill needs; Start passes them with -c.
var Options = []string{
	"listen_addresses=127.0.0.1",
	"max_connections=300",
	// A crash here is a process crash (SIGQUIT, SIGKILL), not a power cut:
	// the page cache keeps what fsync would have written.
	"fsync=off",
	"wal_level=replica",
	"max_wal_senders=5",
	"hot_standby=on",
}

// NewDir creates an empty directory for data directories, owned by the
// user the servers run as.
func NewDir(parent string) (string, error) {
	dir, err := os.MkdirTemp(parent, "sendonce-pg-")
	if err != nil {
		return "", fmt.Errorf("pgserver: %w", err)
	}
	if os.Geteuid() == 0 {
		uid, gid, err := postgresUser()
		if err != nil {
			return "", err
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			return "", fmt.Errorf("pgserver: %w", err)
		}
	}
	return dir, nil
}

func postgresUser() (int, int, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return 0, 0, fmt.Errorf("pgserver: running as root needs a postgres user to run the server: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uid, gid, nil
}

func newServer(bin, data string, port int) *Server {
	s := &Server{Bin: bin, Data: data, Port: port}
	if os.Geteuid() == 0 {
		s.as = []string{"runuser", "-u", "postgres", "--"}
	}
	return s
}

// Init runs initdb into dir/name (trust authentication, user postgres) for a
// server on port; it does not start it.
func Init(ctx context.Context, bin, dir, name string, port int) (*Server, error) {
	s := newServer(bin, filepath.Join(dir, name), port)
	if err := s.run(ctx, "initdb", "-D", s.Data, "-A", "trust", "-U", "postgres", "--no-sync"); err != nil {
		return nil, err
	}
	return s, nil
}

// BaseBackup makes a streaming standby of the server at host:port in
// dir/name for a server on its own port: pg_basebackup with -R writes
// standby.signal and a primary_conninfo pointing at host:port (a proxy in
// front of the primary, when the caller wants to cut the link).
func BaseBackup(ctx context.Context, bin, host string, fromPort int, dir, name string, port int) (*Server, error) {
	s := newServer(bin, filepath.Join(dir, name), port)
	err := s.run(ctx, "pg_basebackup", "-h", host, "-p", strconv.Itoa(fromPort), "-U", "postgres",
		"-D", s.Data, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) run(ctx context.Context, name string, args ...string) error {
	argv := append(append(append([]string{}, s.as...), filepath.Join(s.Bin, name)), args...)
	if _, err := proc.Run(ctx, argv[0], argv[1:], nil); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

func (s *Server) pgctl(ctx context.Context, args ...string) error {
	return s.run(ctx, "pg_ctl", append([]string{"-D", s.Data, "-w", "-t", "120"}, args...)...)
}

// LogPath is the server's log file.
func (s *Server) LogPath() string { return s.Data + ".log" }

// Start starts the server and waits until it accepts connections.
func (s *Server) Start(ctx context.Context) error {
	opts := fmt.Sprintf("-p %d -k %s", s.Port, filepath.Dir(s.Data))
	for _, o := range Options {
		opts += " -c " + o
	}
	return s.pgctl(ctx, "start", "-l", s.LogPath(), "-o", opts)
}

// Crash stops the server the way a crash would: immediate mode, no
// checkpoint, every backend killed, nothing more sent to a standby.
func (s *Server) Crash(ctx context.Context) error { return s.pgctl(ctx, "stop", "-m", "immediate") }

// Stop stops the server cleanly (fast mode: sessions are cut).
func (s *Server) Stop(ctx context.Context) error { return s.pgctl(ctx, "stop", "-m", "fast") }

// Promote turns a standby into a primary and waits until it accepts
// writes.
func (s *Server) Promote(ctx context.Context) error { return s.pgctl(ctx, "promote") }

// URL is a postgres URL of database db on the server.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// StopQuietly stops the server, fast, ignoring errors (a server already
// down); for clean-ups.
func (s *Server) StopQuietly() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = s.run(ctx, "pg_ctl", "-D", s.Data, "-w", "-t", "30", "stop", "-m", "immediate")
}
