package envflag

import (
	"fmt"
	"strings"
)

// Markdown renders settings as a Markdown table (variable, flag, default,
// meaning), the form docs/configuration.md holds for each program.
func Markdown(settings []Setting) string {
	var b strings.Builder
	b.WriteString("| variable | flag | default | meaning |\n|---|---|---|---|\n")
	for _, st := range settings {
		env := ""
		if st.Env != "" {
			env = "`" + st.Env + "`"
			if st.Secret {
				env += " or `" + st.Env + "_FILE`"
			}
		}
		def := ""
		if st.Default != "" {
			def = "`" + st.Default + "`"
		}
		flag := "`-" + st.Flag + "`"
		if st.Secret {
			flag = "none (secret)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", env, flag, def, cell(st.Usage))
	}
	return b.String()
}

// cell makes text safe inside a table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// Section markers: a generated section of a document starts with
// SectionStart(name) on a line of its own and ends with SectionEnd(name).
func SectionStart(name string) string { return "<!-- settings " + name + " (generated: make docs) -->" }

// SectionEnd: see SectionStart.
func SectionEnd(name string) string { return "<!-- end settings " + name + " -->" }

// Section returns the text between the markers of section name in doc, and
// whether the markers are there.
func Section(doc, name string) (string, bool) {
	_, rest, ok := strings.Cut(doc, SectionStart(name)+"\n")
	if !ok {
		return "", false
	}
	body, _, ok := strings.Cut(rest, SectionEnd(name))
	return body, ok
}

// ReplaceSection returns doc with section name's text replaced by body, and
// whether the markers are there.
func ReplaceSection(doc, name, body string) (string, bool) {
	start, end := SectionStart(name)+"\n", SectionEnd(name)
	i := strings.Index(doc, start)
	if i < 0 {
		return doc, false
	}
	j := strings.Index(doc[i+len(start):], end)
	if j < 0 {
		return doc, false
	}
	return doc[:i+len(start)] + body + doc[i+len(start)+j:], true
}
