// Package manifests holds Embark's deployment manifests (kustomize: base/,
// istio-operator/, monitoring/, examples/) and the tests that build them
// with the kustomize library, validate every object against schemas taken
// from the real test API server, apply them with server-side dry run,
// prove the RBAC is sufficient by running the real endpoint as its
// ServiceAccount, lint Embark's metrics and check every PromQL query of the
// dashboard and alerts. It has no Go API.
package manifests
