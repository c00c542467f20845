package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// The testdata files are cut from a real govulncheck v1.9.0 run over this
// module on go1.26.8, against the vulndb version scripts/govulncheck.sh uses.
func run(t *testing.T, name string) (bool, string) {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := scan(f)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ok := rep.write(&out)
	return ok, out.String()
}

func TestCalledStdlibFails(t *testing.T) {
	ok, out := run(t, "stdlib-called.json")
	if ok {
		t.Fatalf("a called standard-library vulnerability passed:\n%s", out)
	}
	if !strings.Contains(out, "FAIL: GO-2026-6809 in the standard library v1.26.8 is called: crypto/x509.Verify (fixed in v1.26.10)") {
		t.Errorf("output does not name the called function:\n%s", out)
	}
	if strings.Contains(out, "note: GO-2026-6809") {
		t.Errorf("a called vulnerability is also listed as not called:\n%s", out)
	}
}

func TestImportedOnlyPasses(t *testing.T) {
	ok, out := run(t, "imported-only.json")
	if !ok {
		t.Fatalf("imported-only findings failed:\n%s", out)
	}
	for _, want := range []string{
		"note: GO-2026-5932 in golang.org/x/crypto",
		"note: GO-2026-6604 in stdlib v1.26.8 is imported but not called",
		"0 called vulnerabilities (0 in the standard library), 2 imported but not called",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestCalledModuleFails(t *testing.T) {
	in := `{"finding":{"osv":"GO-0000-0001","fixed_version":"v1.2.3","trace":[{"module":"example.com/m","version":"v1.2.2","package":"example.com/m/p","function":"F"}]}}`
	rep, err := scan(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if rep.write(&out) {
		t.Fatalf("a called module vulnerability passed:\n%s", out.String())
	}
}

func TestGarbageIsAnError(t *testing.T) {
	if _, err := scan(strings.NewReader(`{"finding": [`)); err == nil {
		t.Fatal("truncated output was accepted")
	}
}
