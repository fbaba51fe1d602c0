// Package registry owns the lifecycle of WorkloadAutoRegistration and Istio
// WorkloadEntry resources, and is the only package that writes them:
//
//   - Registrar: the rules of the onboarding API's Register (Enroll,
//     enroll.go: the policy re-check, the WorkloadGroup, the address proof,
//     reuse by the same agent session or takeover with a fresh proof), and
//     what Write (register.go) stores: naming,
//     the WorkloadGroup snapshot, the registration and its WorkloadEntry,
//     IP-reuse fencing, the sidecar's Secret-bound service-account token
//     (credential.go);
//   - presence (registry/presence): AgentConnected, the connection
//     timestamps and the health mirror, written by the replica holding a
//     workload's ADS stream;
//   - lifecycle (registry/lifecycle): Lease-elected grace-period removal,
//     the WorkloadGroupOutOfDate condition, and the re-creation of a
//     WorkloadEntry deleted while its registration lives;
//   - replica (registry/replica): the replicas' liveness Leases and the
//     election of the one that sweeps;
//   - enforcement (registry/enforcement): the ConfigurationEnforced
//     condition;
//   - UpdateRegistrationStatus, the one "write status only when it
//     changed" helper of the reconcilers (reconcile.go); the claims of the
//     sidecar token are read by registry/boundtoken.
//
// Embark's WorkloadEntries carry annotations of its own
// (onboarding.tetrate.io/), never istiod's auto-registration annotations,
// which make istiod's clean-up delete them (workloadentry.go).
//
// Every write goes through the replica's one write.Writer (registry/write):
// rate-limited by the replica's write budget and retried with bounded
// backoff; optimistic concurrency where two replicas may write. The
// background writers (lifecycle, enforcement, rollout) run on the one loop
// of internal/loop, with its one retry policy. The node ID
// a sidecar presents is built and parsed by registry/nodeid; rollouts of
// WorkloadGroups are registry/rollout.
package registry
