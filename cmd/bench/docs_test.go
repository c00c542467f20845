package main

import (
	"io"
	"testing"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/testkit"
)

// docs/configuration.md lists every setting of bench, generated from its
// flag definitions (make docs).
func TestSettingsDoc(t *testing.T) {
	t.Parallel()
	s := envflag.New("bench", testkit.EnvMap(nil), io.Discard)
	bind(s, &config{})
	testkit.SettingsDoc(t, "../../docs/configuration.md", "bench", s.Settings())
}
