// Package rollout rolls a WorkloadGroup's changes out to its onboarded
// workloads, for groups opted in with a WorkloadGroupRollout: on the
// sweeping (Lease-elected) endpoint replica, it asks the connected,
// out-of-date workloads to onboard again, at most maxUnavailable at a time,
// by deleting their registrations (their agents' registration watch sees it
// and onboards again: a fresh WorkloadGroup snapshot, a new bootstrap, the
// sidecar restarted). A batch is done when each of its workloads is back
// with the group's current spec, connected, and Healthy where the group has
// a probe; a batch that misses its progress deadline pauses the rollout. The
// rollout's state (the batch, its deadline) lives in the rollout's status,
// so a replica that takes over the sweeping continues where it stopped.
package rollout
