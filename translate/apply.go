package translate

import (
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/embark-mesh/embark/translate/endpoints"
	"github.com/embark-mesh/embark/translate/internal/envoyconf"
	"github.com/embark-mesh/embark/translate/rbac"
	"github.com/embark-mesh/embark/translate/selection"
)

// This file ties the subpackages to the workload being translated: which
// objects apply to it (package selection) and its inbound authorization
// (package rbac), with the names of package translate's API that they
// define.

// DefaultRootNamespace is Istio's default config root namespace.
const DefaultRootNamespace = "istio-system"

// Names of the SDS resources and the bootstrap cluster Istio's pilot-agent
// serves them on (its bootstrap defines the "sds-grpc" cluster on the
// agent's workload-spiffe-uds socket).
const (
	SDSClusterName = envoyconf.SDSClusterName
	SDSCertName    = envoyconf.SDSCertName
	SDSRootCAName  = envoyconf.SDSRootCAName
)

// Annotations and conditions of WorkloadEntry health (see package
// endpoints).
const (
	HealthChecksAnnotation = endpoints.HealthChecksAnnotation
	HealthyCondition       = endpoints.HealthyCondition
)

// HostForm is one parsed entry of a Sidecar egress listener's hosts (see
// package selection).
type HostForm = selection.HostForm

// ParseHostForm parses a Sidecar egress host such as "./*", "bookinfo/*",
// "*/details.bookinfo.svc.cluster.local", "~/*" or "*/example.org".
func ParseHostForm(s string) (HostForm, error) { return selection.ParseHostForm(s) }

// MTLSMode is how an ingress port accepts connections (see package
// selection).
type MTLSMode = selection.MTLSMode

// The modes of PeerAuthentication that translation distinguishes.
const (
	MTLSPermissive = selection.MTLSPermissive
	MTLSStrict     = selection.MTLSStrict
	MTLSDisable    = selection.MTLSDisable
)

// UnenforcedPolicy is a policy that applies to the workload but that
// standalone translation cannot enforce (see package rbac).
type UnenforcedPolicy = rbac.UnenforcedPolicy

// Kinds of the policies translation reads for inbound enforcement.
const (
	KindAuthorizationPolicy   = rbac.KindAuthorizationPolicy
	KindRequestAuthentication = rbac.KindRequestAuthentication
)

// labelsMatch reports whether every selector label is in labels.
func labelsMatch(selector, labels map[string]string) bool {
	return selection.LabelsMatch(selector, labels)
}

// selectSidecar picks the Sidecar that applies to the workload.
func selectSidecar(sidecars []*istionetworkingv1.Sidecar, w Workload, root string) *istionetworkingv1.Sidecar {
	return selection.Sidecar(sidecars, w.Namespace, w.Labels, root)
}

// appliesTo reports whether a security policy of namespace ns with the
// given selector and targetRefs applies to the workload, as istiod decides
// it for a sidecar: a policy with targetRefs applies to gateways and
// waypoints only; one without them applies when it is in the workload's
// namespace or the root namespace and its selector (none: every workload)
// matches the workload's labels.
func appliesTo(ns string, selector map[string]string, targeted bool, w Workload, root string) bool {
	if targeted || (ns != w.Namespace && ns != root) {
		return false
	}
	return labelsMatch(selector, w.Labels)
}

// authz is the inbound authorization every ingress chain of the workload
// enforces.
type authz struct {
	rules      *rbac.Authorization
	unenforced []UnenforcedPolicy
}

// newAuthz reads the policies that apply to the workload.
func newAuthz(in *Inputs, root string) *authz {
	rules := rbac.New(in.AuthorizationPolicies, in.RequestAuthentications, func(ns string, selector map[string]string, targeted bool) bool {
		return appliesTo(ns, selector, targeted, in.Workload, root)
	})
	return &authz{rules: rules, unenforced: rules.Unenforced()}
}
