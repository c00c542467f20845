package main

import (
	"io"
	"testing"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/testkit"
)

// docs/configuration.md lists every setting of smsstub, generated from its
// flag definitions (make docs).
func TestSettingsDoc(t *testing.T) {
	t.Parallel()
	s := envflag.New("smsstub", testkit.EnvMap(nil), io.Discard)
	bind(s, &options{})
	testkit.SettingsDoc(t, "../../docs/configuration.md", "smsstub", s.Settings())
}
