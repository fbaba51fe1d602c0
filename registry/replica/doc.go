// Package replica tells the onboarding endpoint's replicas about each
// other, through coordination.k8s.io Leases:
//
//   - liveness: each replica keeps a Lease of its own,
//     embark-replica-<replica> (Heartbeat), so that the others can tell
//     whether the replica recorded as holding a workload's ADS stream is
//     alive, and when it went away (Leases, State);
//   - election: one replica at a time, elected through a Lease of its own
//     (Election), leads: registry/lifecycle runs its sweeper and
//     reconcilers there.
//
// It writes nothing but Leases.
package replica
