// Package presence writes what an endpoint replica knows first-hand about the
// workloads whose sidecars hold ADS streams to it:
//
//   - Connections (connection.go): the AgentConnected condition and
//     status.connection of each WorkloadAutoRegistration, and, on connect,
//     the onboarding.tetrate.io/connected-at and /connected-replica
//     annotations of its WorkloadEntry (a disconnect writes the
//     registration's status only); Watch reasserts a live connection whose
//     stored status another component lost; a workload whose last stream
//     here closed and which has not connected again after
//     OutOfTrafficAfter is taken out of traffic with one write to its
//     WorkloadEntry, put back by its next connect (traffic.go);
//   - HealthMirror (health.go, damping.go): the sidecar's health reports
//     mirrored onto the WorkloadEntry's Healthy condition (what istiod
//     routes by) and the registration's, with flap damping;
//   - their metrics (connection.go, health_metrics.go).
//
// Both keep, per workload, the latest state to store, replaced by a newer one
// and retried until stored, in one kind of queue (latest, queue.go); both
// write through the replica's one write.Writer. The xDS server reports stream opens, closes and health
// reports; it never writes itself.
//
// The registry's packages: registry (registration: Registrar, naming,
// sidecar credential, WorkloadEntry shape, address fencing),
// registry/enforcement (the ConfigurationEnforced condition),
// registry/lifecycle (sweeper, drift, entries and orphans, on the elected
// replica), registry/replica (replica Leases and election), registry/presence (this package), registry/write (the write
// budget), registry/nodeid (the node-ID contract), registry/rollout
// (WorkloadGroup rollouts), registry/boundtoken (claims of the sidecar's bound token).
package presence
