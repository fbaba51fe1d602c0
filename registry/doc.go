// Package registry owns the lifecycle of WorkloadAutoRegistration and Istio
// WorkloadEntry resources, and is the only package that writes them:
//
//   - Registrar: naming (seed 000), the WorkloadGroup snapshot, the
//     registration and its WorkloadEntry, IP-reuse fencing, the sidecar's
//     Secret-bound service-account token (credential.go);
//   - Connections: AgentConnected and the connection timestamps, written by
//     the replica holding a workload's ADS stream (connection.go);
//   - Lifecycle: replica liveness Leases, Lease-elected grace-period removal
//     the WorkloadGroupOutOfDate condition, and the re-creation of a
//     WorkloadEntry deleted while its registration lives (replica.go,
//     sweeper.go, drift.go, entries.go).
//
// Embark's WorkloadEntries carry annotations of its own
// (onboarding.tetrate.io/), never istiod's auto-registration annotations,
// which make istiod's clean-up delete them (workloadentry.go).
//
// Every write is rate-limited and retried with bounded backoff, and uses
// optimistic concurrency where two replicas may write.
package registry
