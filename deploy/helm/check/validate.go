package check

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/client-go/kubernetes/scheme"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Object is one rendered document, parsed.
type Object struct {
	Source     string // template it came from
	APIVersion string
	Kind       string
	Name       string
	JSON       []byte
	Raw        map[string]any
	Typed      any // the Go type it decoded into (nil for a CRD-validated kind)
}

func (o *Object) String() string { return o.Kind + "/" + o.Name }

// Parse reads a rendered document: YAML as the API server's client
// reads it (duplicate keys refused), into JSON and a map.
func Parse(d Doc) (*Object, error) {
	j, err := yaml.YAMLToJSONStrict([]byte(d.YAML))
	if err != nil {
		return nil, fmt.Errorf("%s: not valid YAML: %w", d.Source, err)
	}
	o := &Object{Source: d.Source, JSON: j}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(j, &o.Raw); err != nil || o.Raw == nil {
		return nil, fmt.Errorf("%s: not a YAML mapping (%v)", d.Source, err)
	}
	o.APIVersion, _ = o.Raw["apiVersion"].(string)
	o.Kind, _ = o.Raw["kind"].(string)
	if md, ok := o.Raw["metadata"].(map[string]any); ok {
		o.Name, _ = md["name"].(string)
	}
	return o, nil
}

// Validator checks objects against the schemas of the kinds they claim.
type Validator struct {
	scaledObject *crdSchema
}

// customTypes are the CRD kinds validated by strict decoding into their
// project's own Go types.
var customTypes = map[schema.GroupVersionKind]func() any{
	monitoringv1.SchemeGroupVersion.WithKind("ServiceMonitor"): func() any { return &monitoringv1.ServiceMonitor{} },
	monitoringv1.SchemeGroupVersion.WithKind("PodMonitor"):     func() any { return &monitoringv1.PodMonitor{} },
	monitoringv1.SchemeGroupVersion.WithKind("PrometheusRule"): func() any { return &monitoringv1.PrometheusRule{} },
}

var scaledObjectGVK = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObject"}

// NewValidator loads KEDA's ScaledObject CRD from the file given (see
// KedaCRD).
func NewValidator(scaledObjectCRD string) (*Validator, error) {
	s, err := loadCRD(scaledObjectCRD, "v1alpha1")
	if err != nil {
		return nil, fmt.Errorf("KEDA ScaledObject CRD: %w", err)
	}
	return &Validator{scaledObject: s}, nil
}

// Validate returns what is wrong with o, each problem a line naming the
// field. An apiVersion/kind it has no schema for is a problem too.
func (v *Validator) Validate(o *Object) []string {
	if o.APIVersion == "" || o.Kind == "" {
		return []string{"no apiVersion or kind"}
	}
	gv, err := schema.ParseGroupVersion(o.APIVersion)
	if err != nil {
		return []string{fmt.Sprintf("apiVersion %q: %v", o.APIVersion, err)}
	}
	gvk := gv.WithKind(o.Kind)
	if gvk == scaledObjectGVK {
		o.Typed = nil
		return v.scaledObject.validate(o.Raw)
	}
	var typed any
	if newT, ok := customTypes[gvk]; ok {
		typed = newT()
	} else if scheme.Scheme.Recognizes(gvk) {
		typed, _ = scheme.Scheme.New(gvk)
	} else {
		return []string{fmt.Sprintf("unknown apiVersion/kind %s %s: no schema to check it against", o.APIVersion, o.Kind)}
	}
	problems := strictDecode(o.JSON, typed)
	missing, err := MissingRequired(reflect.TypeOf(typed), o.Raw)
	if err != nil {
		return append(problems, err.Error())
	}
	for _, p := range missing {
		problems = append(problems, fmt.Sprintf("%s: required field missing", p))
	}
	o.Typed = typed
	return problems
}

// strictDecode decodes as the API server's strict field validation
// does: case-sensitive keys, unknown and duplicate fields refused, and
// every value of its field's type.
func strictDecode(j []byte, into any) []string {
	strict, err := kjson.UnmarshalStrict(j, into)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	for _, e := range strict {
		problems = append(problems, e.Error())
	}
	return problems
}

// crdSchema is one version of a CRD's schema, as the API server uses it
// to prune, validate and run the CEL rules of a custom resource.
type crdSchema struct {
	structural *structuralschema.Structural
	validator  apiservervalidation.SchemaValidator
	cel        *cel.Validator
}

func loadCRD(path, version string) (*crdSchema, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var v1props *apiextensionsv1.JSONSchemaProps
	for _, ver := range crd.Spec.Versions {
		if ver.Name == version && ver.Schema != nil {
			v1props = ver.Schema.OpenAPIV3Schema
		}
	}
	if v1props == nil {
		return nil, fmt.Errorf("%s: no openAPIV3Schema for version %s", path, version)
	}
	// The API server works on the internal (unversioned) form.
	var props apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v1props, &props, nil); err != nil {
		return nil, err
	}
	s, err := structuralschema.NewStructural(&props)
	if err != nil {
		return nil, fmt.Errorf("%s: not a structural schema: %w", path, err)
	}
	if errs := structuralschema.ValidateStructural(nil, s); len(errs) > 0 {
		return nil, fmt.Errorf("%s: not a structural schema: %v", path, errs.ToAggregate())
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(&props)
	if err != nil {
		return nil, err
	}
	return &crdSchema{
		structural: s,
		validator:  validator,
		cel:        cel.NewValidator(s, true, celconfig.PerCallLimit),
	}, nil
}

// validate checks a custom resource as the API server would on create
// with strict field validation: fields the schema does not know (which
// the server would prune) are errors, then the schema's types, required
// fields, enums and formats, then its x-kubernetes-validations.
func (c *crdSchema) validate(raw map[string]any) []string {
	var problems []string
	obj := deepCopy(raw)
	pruned := pruning.PruneWithOptions(obj, c.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	for _, p := range pruned {
		problems = append(problems, fmt.Sprintf("%s: unknown field (the API server would prune it)", p))
	}
	// Pruning spares metadata; the API server reads it as an ObjectMeta.
	if md, ok := raw["metadata"]; ok {
		j, _ := json.Marshal(md)
		for _, p := range strictDecode(j, &metav1.ObjectMeta{}) {
			problems = append(problems, "metadata: "+p)
		}
	}
	for _, e := range apiservervalidation.ValidateCustomResource(nil, raw, c.validator) {
		problems = append(problems, e.Error())
	}
	if len(problems) == 0 { // CEL rules assume a well-typed object
		errs, _ := c.cel.Validate(context.Background(), nil, c.structural, raw, nil, celconfig.RuntimeCELCostBudget)
		for _, e := range errs {
			problems = append(problems, e.Error())
		}
	}
	return problems
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, e := range v {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}
