package main

import (
	"io"
	"testing"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/testkit"
)

// docs/configuration.md lists every setting of soak, generated from its
// flag definitions (make docs).
func TestSettingsDoc(t *testing.T) {
	t.Parallel()
	s := envflag.New("soak", testkit.EnvMap(nil), io.Discard)
	bind(s, &config{})
	testkit.SettingsDoc(t, "../../docs/configuration.md", "soak", s.Settings())
}
