package sendonce_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// Every program under cmd/ has its settings table in docs/configuration.md
// (each program's own test keeps the table in step with its flags).
func TestEveryProgramIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := os.ReadDir("cmd")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if !c.IsDir() {
			continue
		}
		if _, ok := envflag.Section(string(doc), c.Name()); !ok {
			t.Errorf("docs/configuration.md has no settings of %s: add the lines %q and %q where they belong, a TestSettingsDoc to cmd/%s, then run make docs",
				c.Name(), envflag.SectionStart(c.Name()), envflag.SectionEnd(c.Name()), c.Name())
		}
	}
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// The repository stands alone: every relative link of its documents leads
// to a file inside it, and no document points at a sibling directory.
func TestDocumentsStayInTheRepository(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	docs, _ := filepath.Glob("docs/*.md")
	docs = append(docs, "README.md", "CONTRIBUTING.md")
	for _, d := range docs {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		// A sibling directory of the checkout is not in a clone.
		if sibling := "../" + "shared"; strings.Contains(string(b), sibling) {
			t.Errorf("%s refers to %s, outside the repository", d, sibling)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") {
				continue
			}
			abs := filepath.Join(root, filepath.Dir(d), target)
			if rel, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links to %s, outside the repository", d, m[1])
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				t.Errorf("%s links to %s, which does not exist", d, m[1])
			}
		}
	}
}
