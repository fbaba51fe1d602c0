// Package v1alpha1 contains the OnboardingPolicy API: namespaced rules that
// authorize workloads with a verified platform identity (an AWS EC2 instance,
// or a host holding a JWT from a configured OIDC issuer) to join WorkloadGroups
// of the same namespace. Onboarding is denied unless a policy allows it.
//
// +kubebuilder:object:generate=true
// +groupName=authorization.onboarding.tetrate.io
package v1alpha1
