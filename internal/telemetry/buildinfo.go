package telemetry

import (
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo returns the gauge sendonce_build_info, always 1, whose labels
// say which build is running: the module version (a tag, a pseudo-version,
// or "(devel)" for a build from a work tree), the VCS revision and whether
// the tree was modified, and the Go version. During a rolling upgrade it
// shows which processes run which release.
func BuildInfo() prometheus.Collector {
	version, revision, modified, goVersion := "unknown", "unknown", "false", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		version, goVersion = bi.Main.Version, bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sendonce_build_info",
		Help: "Always 1; the labels name the running build (module version, VCS revision, Go version).",
		ConstLabels: prometheus.Labels{
			"version": version, "revision": revision, "modified": modified, "goversion": goVersion,
		},
	})
	g.Set(1)
	return g
}
