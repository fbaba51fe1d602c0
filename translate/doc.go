// Package translate holds the pure function from the Istio configuration
// that applies to one onboarded workload (its Sidecar, PeerAuthentications,
// Services, EndpointSlices, ServiceEntries, WorkloadEntries and pods) to
// the Envoy v3 resources its sidecar is served: ingress listeners on the
// workload's address forwarding to the application (127.0.0.1), egress
// listeners bound on 127.0.0.2 with their routes, Istio-named clusters with
// Istio mutual TLS through the local agent's SDS secrets, and endpoints
// where VMs and pods load-balance together. No I/O, no clocks, every list
// sorted; golden-file tested. docs/translate.md describes what is
// translated and the defaults.
//
// Its parts by concept: package selection decides which objects apply to
// the workload (Sidecar, PeerAuthentication mode, egress host forms,
// exportTo), package endpoints lists a destination's endpoints, package
// rbac turns AuthorizationPolicies into Envoy RBAC filters, and
// internal/envoyconf builds the Envoy messages of Istio's shapes. This
// package assembles them into listeners, routes, clusters and endpoints;
// none of them imports anything else of Embark.
package translate
