package main

import (
	"io"
	"testing"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/testkit"
)

// docs/configuration.md lists every setting of relay, generated from its
// flag definitions (make docs).
func TestSettingsDoc(t *testing.T) {
	t.Parallel()
	s := envflag.New("relay", testkit.EnvMap(nil), io.Discard)
	bind(s, &config{})
	testkit.SettingsDoc(t, "../../docs/configuration.md", "relay", s.Settings())

	s = envflag.New("relay migrate", testkit.EnvMap(nil), io.Discard)
	var down int
	bindMigrate(s, new(service.Settings), &down)
	testkit.SettingsDoc(t, "../../docs/configuration.md", "relay migrate", s.Settings())
}
