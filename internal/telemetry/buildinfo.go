package telemetry

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/build"
)

// BuildInfo returns the gauge sendonce_build_info, always 1, whose labels
// say which build is running: the module version (a tag, a pseudo-version,
// or "(devel)" for a build from a work tree), the VCS revision and whether
// the tree was modified, and the Go version. During a rolling upgrade it
// shows which processes run which release.
func BuildInfo() prometheus.Collector {
	b := build.Read()
	revision := b.Revision
	if revision == "" {
		revision = "unknown"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sendonce_build_info",
		Help: "Always 1; the labels name the running build (module version, VCS revision, Go version).",
		ConstLabels: prometheus.Labels{
			"version": b.Version, "revision": revision, "modified": strconv.FormatBool(b.Modified), "goversion": b.Go,
		},
	})
	g.Set(1)
	return g
}
