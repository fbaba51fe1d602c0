package translate

import (
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
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
}

// Result is a workload's complete configuration, ready to be served.
type Result struct {
	// Sidecar is the Sidecar that was selected, nil when the documented
	// default applied.
	Sidecar *istionetworkingv1.Sidecar
	// Listeners, Routes, Clusters and Endpoints are Envoy v3 resources in a
	// deterministic order.
	Listeners, Routes, Clusters, Endpoints []types.Resource
}

// Translate computes the workload's configuration. It returns an error
// (naming the Sidecar and the field) when the selected Sidecar cannot be
// translated; callers keep serving the previous configuration and report
// the error on the Sidecar.
func Translate(in *Inputs) (*Result, error) {
	return &Result{}, nil
}
