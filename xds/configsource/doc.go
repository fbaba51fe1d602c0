// Package configsource computes what each onboarded sidecar is served over
// xDS. It reads Sidecars, Services, EndpointSlices, ServiceEntries and
// WorkloadEntries from informers, builds translate.Inputs for a proxy,
// translates and validates them, and hands the xDS server a snapshot whose
// every resource type carries a version that is a hash of its content, so an
// unchanged type is never pushed again.
//
// Proxies of one scope (translate.ScopeKey: namespace and the objects
// selecting the workload) share one translation of the scope until the
// inputs change (translate.Prepare); each proxy adds, validates and hashes
// only its own ingress listeners and inbound clusters (Shared.For).
//
// Changes to the inputs are debounced and recomputed only for the proxies
// they may affect (see Affected for the rule). When a translation fails or a
// resource does not validate, the proxy keeps the last configuration that
// did (an empty one if none ever did) and a Warning Event
// InvalidConfiguration is recorded on the Sidecar (or on the workload's
// registration when no Sidecar is to blame).
package configsource
