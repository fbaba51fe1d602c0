// Package translate will hold pure functions from Istio configuration
// (Sidecar, WorkloadGroup, Services, ServiceEntries, WorkloadEntries,
// EndpointSlices) to Envoy resources: ingress listeners on the host address
// forwarding to 127.0.0.1, egress listeners bound on 127.0.0.2, clusters,
// routes and endpoints. No I/O; golden-file tested.
//
// Nothing is implemented here yet; see the translate issue.
package translate
