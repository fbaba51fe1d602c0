package translate

import (
	"errors"
	"fmt"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/embark-mesh/embark/translate/endpoints"
)

// Mesh holds the mesh-wide settings translation depends on.
type Mesh struct {
	// TrustDomain of SPIFFE IDs (spiffe://<trust domain>/ns/<ns>/sa/<sa>).
	// Default "cluster.local".
	TrustDomain string
	// ClusterID is the Kubernetes cluster's Istio cluster ID.
	ClusterID string
	// DomainSuffix of Service host names. Default "cluster.local".
	DomainSuffix string
}

// Workload is the onboarded workload whose configuration is translated.
type Workload struct {
	// Name and Namespace of its WorkloadAutoRegistration.
	Name, Namespace string
	// Address is the workload's host IP (the ingress listeners bind to it).
	Address string
	// Labels are the workload's labels (WorkloadGroup template labels plus
	// the registration's own); Sidecar workloadSelectors match them.
	Labels map[string]string
	// ServiceAccount the workload runs as.
	ServiceAccount string
}

// Inputs are every object translation reads. Slices are not modified and
// need not be sorted; nil slices are empty.
type Inputs struct {
	Mesh     Mesh
	Workload Workload
	// Sidecars of the workload's namespace and of the root namespace.
	Sidecars        []*istionetworkingv1.Sidecar
	Services        []*corev1.Service
	EndpointSlices  []*discoveryv1.EndpointSlice
	ServiceEntries  []*istionetworkingv1.ServiceEntry
	WorkloadEntries []*istionetworkingv1.WorkloadEntry
	// RootNamespace is Istio's config root namespace (default
	// "istio-system"): its selector-less Sidecar is the mesh-wide default.
	RootNamespace string
	// PeerAuthentications of the workload's namespace and of the root
	// namespace decide whether ingress also accepts plaintext (PERMISSIVE,
	// the default) or only Istio mutual TLS (STRICT).
	PeerAuthentications []*istiosecurityv1.PeerAuthentication
	// Pods give the service accounts of EndpointSlice endpoints (through
	// their targetRef) for the SAN of outbound mutual TLS. Optional: without
	// them a destination's SAN is checked by namespace prefix only.
	Pods []*corev1.Pod
	// AuthorizationPolicies and RequestAuthentications of the workload's
	// namespace and of the root namespace (security.istio.io/v1). Those
	// that select the workload are enforced on every ingress chain: the
	// ALLOW/DENY subset of docs/translate.md as Envoy RBAC, anything else
	// by refusing all inbound traffic (Result.Unenforced).
	AuthorizationPolicies  []*istiosecurityv1.AuthorizationPolicy
	RequestAuthentications []*istiosecurityv1.RequestAuthentication
	// Endpoints, when set, is endpoints.NewIndex of EndpointSlices, Pods
	// and WorkloadEntries, built by the caller to be reused by its
	// translations while those do not change (it remembers each port's
	// endpoints). Default: built by each translation.
	Endpoints *endpoints.Index
}

// Result is a workload's complete configuration, ready to be served.
type Result struct {
	// Sidecar is the Sidecar that was selected, nil when the documented
	// default applied.
	Sidecar *istionetworkingv1.Sidecar
	// Listeners, Routes, Clusters and Endpoints are Envoy v3 resources in a
	// deterministic order.
	Listeners, Routes, Clusters, Endpoints []types.Resource
	// Warnings name parts of the Sidecar that were valid but could not be
	// translated unambiguously (for example a TCP egress port with several
	// destinations); they were left out. Sorted.
	Warnings []string
	// Unenforced are the policies that select the workload but that
	// translation cannot enforce; when there are any, every ingress filter
	// chain refuses all traffic (fail closed). Sorted.
	Unenforced []UnenforcedPolicy
}

// ByType returns the resources keyed by go-control-plane resource type URL,
// the shape cache.NewSnapshot takes.
func (r *Result) ByType() map[resource.Type][]types.Resource {
	return map[resource.Type][]types.Resource{
		resource.ListenerType: r.Listeners,
		resource.RouteType:    r.Routes,
		resource.ClusterType:  r.Clusters,
		resource.EndpointType: r.Endpoints,
	}
}

// validator is what every generated Envoy message implements.
type validator interface{ ValidateAll() error }

// Validate runs each resource's ValidateAll (the protoc-gen-validate rules
// Envoy itself enforces) and returns every failure joined.
func (r *Result) Validate() error {
	var errs []error
	for _, group := range [][]types.Resource{r.Listeners, r.Routes, r.Clusters, r.Endpoints} {
		for _, res := range group {
			v, ok := res.(validator)
			if !ok {
				errs = append(errs, fmt.Errorf("%T has no ValidateAll", res))
				continue
			}
			if err := v.ValidateAll(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", resourceName(res), err))
			}
		}
	}
	return errors.Join(errs...)
}

// SidecarError says why the selected Sidecar cannot be translated. Callers
// keep serving the previous configuration and report it as an Event on the
// Sidecar.
type SidecarError struct {
	// Sidecar is "<namespace>/<name>".
	Sidecar string
	// Field is the path of the offending field, e.g. "spec.egress[0].bind".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

func (e *SidecarError) Error() string {
	return fmt.Sprintf("sidecar %s: %s: %s", e.Sidecar, e.Field, e.Reason)
}
