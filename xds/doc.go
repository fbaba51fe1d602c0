// Package xds will own Embark's ADS server, built on go-control-plane: stream
// authentication, binding a sidecar's stream to its WorkloadAutoRegistration,
// liveness events to the registry, health reports, and istio.io/debug/syncz
// for `istioctl proxy-status`.
//
// Nothing is implemented here yet; see the xDS server issue.
package xds
