//go:build !sendonce_crashpoints

package crashpoint

// Enabled reports whether this build has crash points; it has not.
const Enabled = false

// Hit does nothing: this build has no crash points.
func Hit(string) {}
