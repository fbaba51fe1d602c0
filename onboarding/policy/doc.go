// Package policy decides whether a workload with a verified platform identity
// may join a WorkloadGroup, according to the OnboardingPolicies of the
// group's namespace.
//
// [Evaluate] is the pure decision: onboarding is denied by default; a policy
// applies only to WorkloadGroups in its own namespace; a rule allows when one
// of its workloads matchers matches the identity and one of its onboardTo
// selectors selects the group's labels. A denial explains itself for an
// operator: which WorkloadGroup, which identity, and either that the
// namespace has no OnboardingPolicy or which constraints of the closest rules
// failed ([Decision.Message]). [RequiresIAMRoleProof] and
// [Decision.NeedsIAMRoleProof] tell the endpoint when an STS proof of the
// instance's IAM role is worth asking for.
//
// [Authorizer] wires the decision to the cluster: it reads the WorkloadGroup
// and the namespace's OnboardingPolicies from an informer-backed
// client.Reader (a controller-runtime cache), records a Warning Event with
// reason OnboardingDenied on the WorkloadGroup when it denies, and returns
// errors the endpoint maps to gRPC codes: [ErrWorkloadGroupNotFound]
// (FailedPrecondition) and [ErrDenied] (PermissionDenied). This package knows
// nothing about gRPC. docs/policy.md describes the rules for operators.
package policy
