// Package lifecycle is the registry's background work on an endpoint
// replica (Lifecycle, lifecycle.go). It keeps the replica's own Lease and
// campaigns for the embark-sweeper Lease (registry/replica); the one
// elected replica runs the level-based reconcilers below, each on the one
// loop of Embark's background writers (internal/loop: informer watches,
// a queue of registration keys, workers, a periodic resync and one retry
// policy; loop.go holds what they share), and the work it is given to lead
// (the endpoint adds registry/rollout):
//
//   - the sweeper: marks the workloads of a gone replica disconnected
//     (ReplicaGone), removes registrations whose workload had no ADS stream
//     for the grace period, and shows AgentNeverConnected
//     (sweeper.go, neverconnected.go);
//   - drift: the WorkloadGroupOutOfDate condition (drift.go);
//   - entries: a WorkloadEntry deleted while its registration lives is
//     created again (entries.go);
//   - orphans: a sidecar credential Secret or WorkloadEntry whose
//     registration is gone (deleted with orphan propagation) is removed,
//     which revokes the tokens bound to the Secret (orphans.go).
//
// Every status write goes through registry.UpdateRegistrationStatus and the
// replica's one write.Writer; deletions (of registrations and of orphans)
// are paced by RemovalQPS within that budget. The replica Lease's renewal alone has a writer of its own, so a
// saturated write budget never lets it lapse.
package lifecycle
