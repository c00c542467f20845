// Package natscluster runs a NATS JetStream cluster on this machine, each
// node a nats-server process of its own, for the tests, the soak and the
// drills that have to kill a node with SIGKILL, wipe its store and start it
// again. An in-process server cannot be killed like that: its goroutines
// share the test's fate, and a shutdown is always a clean one.
//
// The nodes run the real nats-server binary, built from the module this
// repository pins (Build), with a generated configuration file each: fixed
// client, route and monitoring ports (so that a restarted node comes back
// where its peers and clients look for it) and a store directory of its own.
package natscluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/proc"
	"github.com/sendonce/sendonce/internal/testing/testport"
)

// ServerModule is the package path of the nats-server command, at the
// version go.mod pins.
const ServerModule = "github.com/nats-io/nats-server/v2"

// Build builds the nats-server binary into dir and returns its path. It runs
// the go tool, from inside this module, so that the version is the one
// go.mod pins.
func Build(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "nats-server")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, ServerModule)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("natscluster: go build %s: %v\n%s", ServerModule, err, b)
	}
	return out, nil
}

// BuildCached is Build into a directory of the system's temporary directory
// named after the pinned version, done once: every test process of a run
// (and of later runs) shares the binary.
func BuildCached(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", ServerModule).Output()
	if err != nil {
		return "", fmt.Errorf("natscluster: go list -m %s: %w", ServerModule, err)
	}
	version := strings.TrimSpace(string(b))
	dir := filepath.Join(os.TempDir(), "sendonce-nats-server-"+version)
	bin := filepath.Join(dir, "nats-server")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("natscluster: %w", err)
	}
	// Build beside it and rename: test processes running at once each
	// build, and the last rename wins with an identical file.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", fmt.Errorf("natscluster: %w", err)
	}
	defer os.RemoveAll(tmp)
	built, err := Build(ctx, tmp)
	if err != nil {
		return "", err
	}
	if err := os.Rename(built, bin); err != nil {
		return "", fmt.Errorf("natscluster: %w", err)
	}
	return bin, nil
}

// Config says what to run.
type Config struct {
	// Bin is the nats-server binary; required.
	Bin string
	// Dir holds each node's configuration, store and log; required.
	Dir string
	// Nodes is the cluster size; default 3. One runs a single server
	// without a cluster block.
	Nodes int
	// Name is the cluster's name; default "sendonce".
	Name string
	// SyncInterval is JetStream's sync_interval: empty for the server's
	// default (2 min), "always" to fsync every write, or a duration.
	SyncInterval string
	// Port returns a free TCP port on 127.0.0.1; default testport.Pick. Each
	// node takes three (client, route, monitoring) and keeps them for good.
	Port func() (int, error)
	// Logf receives the cluster's events (a node killed, started, caught
	// up); default none.
	Logf func(format string, args ...any)
}

// Cluster is a running cluster.
type Cluster struct {
	cfg   Config
	nodes []*Node

	adminMu sync.Mutex
	admin   *nats.Conn
}

// Node is one server of the cluster.
type Node struct {
	c *Cluster
	// Name is the node's server_name (n1, n2, ...).
	Name string
	// ClientPort, RoutePort and HTTPPort are the node's listening ports.
	ClientPort, RoutePort, HTTPPort int

	dir string

	mu sync.Mutex
	p  *proc.Process // the current incarnation; nil before the first
}

// Start writes the nodes' configuration files and starts every node, then
// waits until the cluster is healthy (a meta leader, every node current).
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	cfg.Nodes = cmp.Or(cfg.Nodes, 3)
	cfg.Name = cmp.Or(cfg.Name, "sendonce")
	if cfg.Port == nil {
		cfg.Port = testport.Pick
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	switch {
	case cfg.Bin == "":
		return nil, errors.New("natscluster: Config.Bin is required")
	case cfg.Dir == "":
		return nil, errors.New("natscluster: Config.Dir is required")
	case cfg.Nodes < 1 || cfg.Nodes > 9:
		return nil, fmt.Errorf("natscluster: Nodes %d is outside 1..9", cfg.Nodes)
	}
	c := &Cluster{cfg: cfg}
	for i := range cfg.Nodes {
		n := &Node{c: c, Name: fmt.Sprintf("n%d", i+1)}
		var err error
		for _, p := range []*int{&n.ClientPort, &n.RoutePort, &n.HTTPPort} {
			if *p, err = cfg.Port(); err != nil {
				return nil, fmt.Errorf("natscluster: port: %w", err)
			}
		}
		n.dir = filepath.Join(cfg.Dir, n.Name)
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return nil, fmt.Errorf("natscluster: %w", err)
		}
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := os.WriteFile(n.confPath(), []byte(c.conf(n)), 0o644); err != nil {
			return nil, fmt.Errorf("natscluster: write config: %w", err)
		}
	}
	for _, n := range c.nodes {
		if err := n.spawn(); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// conf is node n's configuration file.
func (c *Cluster) conf(n *Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %q\nlisten: \"127.0.0.1:%d\"\nhttp: \"127.0.0.1:%d\"\n", n.Name, n.ClientPort, n.HTTPPort)
	b.WriteString("max_payload: 1MB\n")
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n  max_memory_store: 256MB\n  max_file_store: 64GB\n", n.storeDir())
	if c.cfg.SyncInterval != "" {
		fmt.Fprintf(&b, "  sync_interval: %s\n", c.cfg.SyncInterval)
	}
	b.WriteString("}\n")
	if len(c.nodes) > 1 {
		fmt.Fprintf(&b, "cluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [\n", c.cfg.Name, n.RoutePort)
		for _, p := range c.nodes {
			fmt.Fprintf(&b, "    \"nats-route://127.0.0.1:%d\"\n", p.RoutePort)
		}
		b.WriteString("  ]\n}\n")
	}
	return b.String()
}

// Nodes returns the nodes in name order.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// URL is the comma-separated list of every node's client URL: a client
// given it connects to any node that runs.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// WaitHealthy waits until every running node's /healthz answers ok: the
// node is connected to a meta leader and every stream and consumer it holds
// a replica of is current.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		if err := n.WaitHealthy(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops every node (SIGTERM, then SIGKILL after 15s) and closes the
// admin connection.
func (c *Cluster) Stop() {
	c.adminMu.Lock()
	if c.admin != nil {
		c.admin.Close()
		c.admin = nil
	}
	c.adminMu.Unlock()
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() { _ = n.Stop(15 * time.Second) })
	}
	wg.Wait()
}

// jetStream returns the cluster's own connection, made on first use.
func (c *Cluster) jetStream() (jetstream.JetStream, error) {
	c.adminMu.Lock()
	defer c.adminMu.Unlock()
	if c.admin == nil {
		nc, err := nats.Connect(c.URL(), nats.Name("natscluster-admin"), nats.MaxReconnects(-1),
			nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
		if err != nil {
			return nil, fmt.Errorf("natscluster: connect: %w", err)
		}
		c.admin = nc
	}
	return jetstream.New(c.admin)
}

// StreamLeader returns the node that leads stream, waiting (until ctx ends)
// while the stream has no leader.
func (c *Cluster) StreamLeader(ctx context.Context, stream string) (*Node, error) {
	return c.leader(ctx, "stream "+stream, func(ctx context.Context, js jetstream.JetStream) (*jetstream.ClusterInfo, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return nil, err
		}
		return s.CachedInfo().Cluster, nil
	})
}

// ConsumerLeader returns the node that leads the consumer of stream.
func (c *Cluster) ConsumerLeader(ctx context.Context, stream, consumer string) (*Node, error) {
	return c.leader(ctx, "consumer "+stream+"/"+consumer, func(ctx context.Context, js jetstream.JetStream) (*jetstream.ClusterInfo, error) {
		cons, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return nil, err
		}
		return cons.CachedInfo().Cluster, nil
	})
}

func (c *Cluster) leader(ctx context.Context, what string, info func(context.Context, jetstream.JetStream) (*jetstream.ClusterInfo, error)) (*Node, error) {
	js, err := c.jetStream()
	if err != nil {
		return nil, err
	}
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ci, err := info(rctx, js)
		cancel()
		switch {
		case err != nil:
			last = err
		case ci == nil || ci.Leader == "":
			last = errors.New("no leader")
		default:
			if n := c.Node(ci.Leader); n != nil {
				return n, nil
			}
			last = fmt.Errorf("leader %q is no node of this cluster", ci.Leader)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("natscluster: leader of %s: %w (%w)", what, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// URL is the node's client URL.
func (n *Node) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.ClientPort) }

// LogPath is the file holding the node's output, every incarnation's.
func (n *Node) LogPath() string { return filepath.Join(n.dir, "server.log") }

func (n *Node) confPath() string { return filepath.Join(n.dir, "server.conf") }
func (n *Node) storeDir() string { return filepath.Join(n.dir, "store") }

// Running reports whether the node's process runs.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runningLocked()
}

func (n *Node) runningLocked() bool { return n.p != nil && !n.p.Exited() }

// spawn starts the process; the caller waits for it to be ready.
func (n *Node) spawn() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.runningLocked() {
		return nil
	}
	// Its own process group: a terminal's Ctrl-C reaches only the parent,
	// which stops the nodes in order; proc kills it if the parent dies.
	p, err := proc.Start(proc.Spec{Name: "nats " + n.Name, Path: n.c.cfg.Bin, Args: []string{"-c", n.confPath()},
		LogFile: n.LogPath(), Group: true})
	if err != nil {
		return fmt.Errorf("natscluster: %w", err)
	}
	n.p = p
	n.c.cfg.Logf("nats %s started (pid %d)", n.Name, p.Pid())
	return nil
}

// Start starts the node again, on its ports and store, and waits until it
// accepts clients. It does not wait for the node to catch up: WaitHealthy
// does.
func (n *Node) Start(ctx context.Context) error {
	if err := n.spawn(); err != nil {
		return err
	}
	return n.waitHealthz(ctx, "?js-server-only=true")
}

// Kill ends the node with SIGKILL, as a crash or a power cut would, and
// waits for the process to be gone.
func (n *Node) Kill() error {
	return n.signal(syscall.SIGKILL, 30*time.Second)
}

// Stop ends the node with SIGTERM (a clean shutdown: its clients reconnect
// to the other nodes) and kills it when it has not exited within bound.
func (n *Node) Stop(bound time.Duration) error {
	if err := n.signal(syscall.SIGTERM, bound); err == nil {
		return nil
	}
	return n.Kill()
}

func (n *Node) signal(sig syscall.Signal, bound time.Duration) error {
	n.mu.Lock()
	p := n.p
	running := n.runningLocked()
	n.mu.Unlock()
	if !running {
		return nil
	}
	_ = p.Signal(sig)
	select {
	case <-p.Done():
		n.c.cfg.Logf("nats %s stopped by %s", n.Name, sig)
		return nil
	case <-time.After(bound):
		return fmt.Errorf("natscluster: %s did not exit within %s of %s", n.Name, bound, sig)
	}
}

// WipeStore deletes the node's JetStream store: every stream and consumer
// replica it held, and its copy of the meta layer. The node must be down.
func (n *Node) WipeStore() error {
	if n.Running() {
		return fmt.Errorf("natscluster: wipe the store of %s: it is running", n.Name)
	}
	if err := os.RemoveAll(n.storeDir()); err != nil {
		return fmt.Errorf("natscluster: wipe the store of %s: %w", n.Name, err)
	}
	n.c.cfg.Logf("nats %s store wiped", n.Name)
	return nil
}

// WaitHealthy waits until the node's /healthz answers ok: JetStream runs,
// the node is current with the meta leader, and every stream and consumer
// replica it holds has caught up.
func (n *Node) WaitHealthy(ctx context.Context) error {
	return n.waitHealthz(ctx, "")
}

func (n *Node) waitHealthz(ctx context.Context, query string) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz%s", n.HTTPPort, query)
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	for {
		n.mu.Lock()
		running := n.runningLocked()
		n.mu.Unlock()
		if !running {
			return fmt.Errorf("natscluster: %s is not running (see %s)", n.Name, n.LogPath())
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			var b [512]byte
			k, _ := resp.Body.Read(b[:])
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b[:k])))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natscluster: %s not healthy: %w (last answer: %s)", n.Name, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
