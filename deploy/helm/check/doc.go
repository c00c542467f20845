// Package check renders the Helm chart deploy/helm/sendonce with Helm's own
// SDK and validates what it renders against the Kubernetes, KEDA and
// prometheus-operator schemas and against the repository's code and docs.
// It is a module of its own so that the product's go.mod does not carry
// Helm and the Kubernetes libraries; everything is in its tests
// (bash deploy/helm/check.sh runs them).
package check
