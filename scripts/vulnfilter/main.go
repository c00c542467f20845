// Command vulnfilter reads govulncheck's JSON output on stdin and fails when
// the code calls a vulnerable function, in a required module or in the
// standard library alike. A finding whose trace stops at a package or a module
// (imported or required, never called) is printed as a note and does not fail:
// no code path reaches it.
//
// scripts/govulncheck.sh pipes its govulncheck run through it.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
)

// frame is the part of a govulncheck trace frame the filter reads.
type frame struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Package  string `json:"package"`
	Function string `json:"function"`
}

type finding struct {
	OSV          string  `json:"osv"`
	FixedVersion string  `json:"fixed_version"`
	Trace        []frame `json:"trace"`
}

type message struct {
	Finding *finding `json:"finding"`
}

// key is one vulnerability in one module.
type key struct{ module, osv string }

// report is what a govulncheck run found, each vulnerability once.
type report struct {
	called   map[key]finding // a trace reaches a vulnerable function
	uncalled map[key]finding // imported or required only
}

// scan reads the stream of JSON messages govulncheck -format json writes.
func scan(r io.Reader) (report, error) {
	rep := report{called: map[key]finding{}, uncalled: map[key]finding{}}
	dec := json.NewDecoder(r)
	for {
		var m message
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return rep, fmt.Errorf("reading govulncheck output: %w", err)
		}
		f := m.Finding
		if f == nil || len(f.Trace) == 0 {
			continue
		}
		top := f.Trace[0]
		k := key{top.Module, f.OSV}
		if top.Function != "" {
			rep.called[k] = *f
			delete(rep.uncalled, k)
		} else if _, ok := rep.called[k]; !ok {
			rep.uncalled[k] = *f
		}
	}
	return rep, nil
}

func sorted(m map[key]finding) []key {
	keys := make([]key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].module != keys[j].module {
			return keys[i].module < keys[j].module
		}
		return keys[i].osv < keys[j].osv
	})
	return keys
}

func fixed(f finding) string {
	if f.FixedVersion == "" {
		return "no fixed version"
	}
	return "fixed in " + f.FixedVersion
}

// write prints the report and says whether it passes: no called vulnerability.
func (rep report) write(w io.Writer) bool {
	for _, k := range sorted(rep.uncalled) {
		f := rep.uncalled[k]
		fmt.Fprintf(w, "note: %s in %s %s is imported but not called (%s)\n", k.osv, k.module, f.Trace[0].Version, fixed(f))
	}
	std := 0
	for _, k := range sorted(rep.called) {
		f := rep.called[k]
		top := f.Trace[0]
		where := k.module
		if k.module == "stdlib" {
			std++
			where = "the standard library"
		}
		fmt.Fprintf(w, "FAIL: %s in %s %s is called: %s.%s (%s)\n", k.osv, where, top.Version, top.Package, top.Function, fixed(f))
	}
	fmt.Fprintf(w, "govulncheck: %d called vulnerabilities (%d in the standard library), %d imported but not called\n",
		len(rep.called), std, len(rep.uncalled))
	if std > 0 {
		fmt.Fprintln(w, "the standard library is fixed by a newer Go patch release: raise the toolchain line of go.mod (and the Dockerfile's golang image with it)")
	}
	return len(rep.called) == 0
}

func main() {
	rep, err := scan(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulnfilter:", err)
		os.Exit(2)
	}
	if !rep.write(os.Stdout) {
		os.Exit(1)
	}
}
