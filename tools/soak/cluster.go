package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natscluster"
)

// clusterFaultKinds replace broker_restart with -cluster: the faults of a
// three-node JetStream cluster whose streams keep three copies.
var clusterFaultKinds = []string{
	"nats_leader_kill",          // SIGKILL the node leading SMS, restart it after a pause
	"nats_consumer_leader_kill", // SIGKILL the node leading the senders' consumer, restart it
	"nats_node_restart",         // SIGTERM a node (a rolling restart's step), start it again
	"nats_node_store_loss",      // SIGKILL a node, delete its store, restart it empty: it catches up
}

// kinds returns the fault kinds of this soak: those of its provider mode,
// and with -cluster the cluster's instead of broker_restart.
func (s *soak) kinds() []string {
	kinds := kindsFor(s.cfg.provider)
	if s.cluster == nil {
		return kinds
	}
	var out []string
	for _, k := range kinds {
		if k != "broker_restart" {
			out = append(out, k)
		}
	}
	return append(out, clusterFaultKinds...)
}

// natsURL is what the relays and senders get as NATS_URL: the single
// server, or every node of the cluster as seeds.
func (s *soak) natsURL() string {
	if s.cluster != nil {
		return s.cluster.URL()
	}
	return s.broker.url()
}

// replicas is NATS_REPLICAS for the processes.
func (s *soak) replicas() int {
	if s.cluster != nil {
		return 3
	}
	return 1
}

// startNATS starts the single in-process server, or with -cluster three
// nats-server processes (bin/nats-server, built by make build).
func (s *soak) startNATS(ctx context.Context) error {
	if !s.cfg.cluster {
		var err error
		s.broker, err = startBroker(filepath.Join(s.logDir, "jetstream"))
		return err
	}
	bin := s.cfg.natsServer
	if bin == "" {
		// In -bin, or beside the soak (make build puts it in bin/; the
		// soak's -bin may be bin/crash).
		bin = filepath.Join(s.cfg.binDir, "nats-server")
		if exe, err := os.Executable(); err == nil {
			if _, err := os.Stat(bin); err != nil {
				bin = filepath.Join(filepath.Dir(exe), "nats-server")
			}
		}
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("-cluster needs the nats-server binary (make build puts it in bin/; or -nats-server): %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := natscluster.Start(sctx, natscluster.Config{
		Bin: bin, Dir: filepath.Join(s.logDir, "nats"), Nodes: 3,
		// What a production cluster should run (docs/cluster.md): an
		// acknowledged write is on disk on a majority before the PubAck.
		SyncInterval: "always",
		Logf:         s.logf,
	})
	if err != nil {
		return err
	}
	s.cluster = c
	return nil
}

// natsDescription is the start-up line's account of NATS.
func (s *soak) natsDescription() string {
	if s.cluster != nil {
		return fmt.Sprintf("nats cluster of 3 nodes %s (stores and logs in %s), NATS_REPLICAS=3", s.cluster.URL(), filepath.Join(s.logDir, "nats"))
	}
	return fmt.Sprintf("nats %s (store %s)", s.broker.url(), s.broker.dir)
}

// restoreNATS starts whatever is down and waits until the cluster is
// healthy.
func (s *soak) restoreNATS(ctx context.Context) error {
	if s.cluster == nil {
		return s.broker.start()
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, n := range s.cluster.Nodes() {
		if !n.Running() {
			if err := n.Start(rctx); err != nil {
				return err
			}
		}
	}
	return s.cluster.WaitHealthy(rctx)
}

func (s *soak) stopNATS() {
	switch {
	case s.cluster != nil:
		s.cluster.Stop()
	case s.broker != nil:
		s.broker.stop()
	}
}

// clusterFault injects one fault of a cluster kind and waits until every
// node is back and current again, so that the next fault never meets a
// cluster still short of a copy (two failures at once is more than three
// copies promise to survive).
func (s *soak) clusterFault(ctx context.Context, kind string) (string, bool, error) {
	fctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var n *natscluster.Node
	var err error
	var what string
	switch kind {
	case "nats_leader_kill":
		n, err = s.cluster.StreamLeader(fctx, streams.Stream)
		what = "SMS leader"
	case "nats_consumer_leader_kill":
		n, err = s.cluster.ConsumerLeader(fctx, streams.Stream, streams.Consumer)
		what = "consumer leader"
	default:
		n = s.cluster.Nodes()[s.rng.IntN(len(s.cluster.Nodes()))]
		what = "node"
	}
	if err != nil {
		return "", false, err
	}
	pause := s.uniform(time.Second, 5*time.Second)
	switch kind {
	case "nats_node_restart":
		if err := n.Stop(30 * time.Second); err != nil {
			return "", false, err
		}
	default:
		if err := n.Kill(); err != nil {
			return "", false, err
		}
	}
	detail := fmt.Sprintf("%s %s down for %s", what, n.Name, pause.Round(time.Millisecond))
	if kind == "nats_node_store_loss" {
		if err := n.WipeStore(); err != nil {
			return "", true, err
		}
		detail = fmt.Sprintf("node %s killed, store deleted, down for %s", n.Name, pause.Round(time.Millisecond))
	}
	_ = sleepCtx(ctx, pause)
	start := time.Now()
	if err := n.Start(fctx); err != nil {
		return "", true, err
	}
	if err := s.cluster.WaitHealthy(fctx); err != nil {
		return "", true, fmt.Errorf("%s: cluster not healthy again: %w", detail, err)
	}
	return fmt.Sprintf("%s; back and current %s after its restart", detail, time.Since(start).Round(time.Millisecond)), true, nil
}
