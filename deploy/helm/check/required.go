package check

import (
	"encoding"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
)

// Required fields, by the rule Kubernetes' openapi-gen (and so the
// published OpenAPI schema kubectl validates with) applies to the API
// types: a field is required if its comment says +required, optional if
// it says +optional, and otherwise required unless its json tag has
// omitempty. The markers are comments, which reflection cannot see, so
// they are read from the types' own source in the module cache.
//
// A field counts as given when its key is in the object with a non-null
// value (the API server drops nulls).

// markers maps "pkgpath.Type.Field" to "+required" or "+optional".
var markers = struct {
	sync.Mutex
	loaded map[string]bool // packages read
	of     map[string]string
}{loaded: map[string]bool{}, of: map[string]string{}}

// MissingRequired lists the required fields of t (a struct type, such as
// appsv1.Deployment) absent from raw, the object as JSON decodes into
// map[string]any, by their paths.
func MissingRequired(t reflect.Type, raw any) ([]string, error) {
	if err := loadMarkers(t); err != nil {
		return nil, err
	}
	markers.Lock()
	defer markers.Unlock()
	var missing []string
	walkRequired("", t, raw, &missing)
	return missing, nil
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// opaque types decode themselves (Quantity, IntOrString, Time, ...):
// their JSON is not their fields.
func opaque(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return p.Implements(jsonUnmarshaler) || p.Implements(textUnmarshaler)
}

func walkRequired(path string, t reflect.Type, v any, missing *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if opaque(t) {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return // a type error, which strict decoding reports
		}
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if name == "" && (f.Anonymous || strings.Contains(","+opts+",", ",inline,")) {
				walkRequired(path, f.Type, v, missing) // inlined: its fields are ours
				continue
			}
			if name == "" {
				name = f.Name
			}
			p := name
			if path != "" {
				p = path + "." + name
			}
			val := obj[name]
			if val == nil {
				if isRequired(t, f, opts) {
					*missing = append(*missing, p)
				}
				continue
			}
			walkRequired(p, f.Type, val, missing)
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return // []byte is a base64 string
		}
		items, _ := v.([]any)
		for i, item := range items {
			walkRequired(fmt.Sprintf("%s[%d]", path, i), t.Elem(), item, missing)
		}
	case reflect.Map:
		entries, _ := v.(map[string]any)
		for k, e := range entries {
			walkRequired(fmt.Sprintf("%s[%s]", path, k), t.Elem(), e, missing)
		}
	}
}

func isRequired(t reflect.Type, f reflect.StructField, jsonOpts string) bool {
	switch markers.of[t.PkgPath()+"."+t.Name()+"."+f.Name] {
	case "+required":
		return true
	case "+optional":
		return false
	}
	opts := "," + jsonOpts + ","
	return !strings.Contains(opts, ",omitempty,") && !strings.Contains(opts, ",omitzero,")
}

// loadMarkers reads the markers of every package whose struct types t
// reaches and that is not read yet, with one `go list` for all of them.
func loadMarkers(t reflect.Type) error {
	markers.Lock()
	defer markers.Unlock()
	pkgs := map[string]bool{}
	seen := map[reflect.Type]bool{}
	var visit func(reflect.Type)
	visit = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] || opaque(t) {
			return
		}
		seen[t] = true
		if p := t.PkgPath(); p != "" && !markers.loaded[p] {
			pkgs[p] = true
		}
		for i := range t.NumField() {
			visit(t.Field(i).Type)
		}
	}
	visit(t)
	if len(pkgs) == 0 {
		return nil
	}
	args := []string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}"}
	for p := range pkgs {
		args = append(args, p)
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return fmt.Errorf("go list (to read the API types' +optional/+required markers): %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, dir, _ := strings.Cut(line, "\t")
		if err := readMarkers(pkg, dir); err != nil {
			return err
		}
		markers.loaded[pkg] = true
	}
	return nil
}

// readMarkers records the +optional and +required comments of the struct
// fields declared in the package's source.
func readMarkers(pkg, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return false
			}
			for _, field := range st.Fields.List {
				m := marker(field.Doc)
				if m == "" {
					continue
				}
				for _, n := range fieldNames(field) {
					markers.of[pkg+"."+ts.Name.Name+"."+n] = m
				}
			}
			return false
		})
	}
	return nil
}

// marker is "+required" or "+optional" as the field's doc comment says
// (gengo's comment tags: a line "+name" or "+name=value").
func marker(doc *ast.CommentGroup) string {
	if doc == nil {
		return ""
	}
	for _, c := range doc.List {
		line := strings.TrimSpace(strings.TrimPrefix(c.Text, "//"))
		for _, m := range []string{"+required", "+optional"} {
			if line == m || strings.HasPrefix(line, m+"=") {
				return m
			}
		}
	}
	return ""
}

// fieldNames are a field's names; an embedded field is named by its type.
func fieldNames(f *ast.Field) []string {
	if len(f.Names) > 0 {
		var names []string
		for _, n := range f.Names {
			names = append(names, n.Name)
		}
		return names
	}
	t := f.Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch t := t.(type) {
	case *ast.Ident:
		return []string{t.Name}
	case *ast.SelectorExpr:
		return []string{t.Sel.Name}
	}
	return nil
}
