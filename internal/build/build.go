// Package build describes the running binary's build as the Go toolchain
// recorded it (go version -m shows the same): for -version and for the
// sendonce_build_info metric.
package build

import "runtime/debug"

// Info is one build.
type Info struct {
	// Version is the main module's version: a tag, a pseudo-version from
	// the VCS, or "(devel)".
	Version string
	// Revision and Time are the VCS revision and its commit time, empty
	// when the build recorded none; Modified is set for a build of a tree
	// with uncommitted changes.
	Revision, Time string
	Modified       bool
	// Go is the Go version that built it.
	Go string
}

// Read returns the running binary's build; zero fields where the binary
// recorded nothing.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown", Go: "unknown"}
	}
	i := Info{Version: bi.Main.Version, Go: bi.GoVersion}
	if i.Version == "" {
		i.Version = "(devel)"
	}
	for _, st := range bi.Settings {
		switch st.Key {
		case "vcs.revision":
			i.Revision = st.Value
		case "vcs.time":
			i.Time = st.Value
		case "vcs.modified":
			i.Modified = st.Value == "true"
		}
	}
	return i
}

// String is the build in one line: "v1.2.3, revision abc (2026-12-07T...),
// modified, go1.26.8".
func (i Info) String() string {
	out := i.Version
	if i.Revision != "" {
		out += ", revision " + i.Revision
		if i.Time != "" {
			out += " (" + i.Time + ")"
		}
		if i.Modified {
			out += ", modified"
		}
	}
	return out + ", " + i.Go
}
