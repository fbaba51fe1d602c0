// Package xds is Embark's ADS server, built on go-control-plane (SotW and
// Delta). It authenticates every stream with the sidecar's bound
// service-account token (TokenReview, then the token's bound Secret must be
// the registration's, and the node ID must name that same registration),
// binds streams to their WorkloadAutoRegistration, reports connects and
// disconnects to a ConnectionTracker (the registry's Connections), passes health reports
// (istio.v1.HealthInformation) to a HealthSink, closes a workload's streams
// when its registration is deleted, and answers istio.io/debug/syncz for
// `istioctl proxy-status` on a separate loopback-only debug listener.
//
// What a workload is served depends on the mode. In istiod mode (Options.Relay
// set) every stream's discovery requests are relayed to istiod (package
// relay), which decides the configuration. In standalone mode it comes from a
// ConfigSource, one snapshot per node: package xds/configsource serves the
// translation of Sidecar resources (package translate); EmptyConfig, an empty
// but valid configuration, is the default when none is given.
// go-control-plane's snapshot cache logs through the server's injected logger
// (component=snapshot-cache).
package xds
