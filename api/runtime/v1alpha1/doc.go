// Package v1alpha1 contains the WorkloadAutoRegistration API: one resource per
// onboarded workload (a VM or bare-metal host), created by the onboarding
// endpoint in the namespace of the WorkloadGroup the workload joined. It holds
// the workload's verified platform identity, what the workload reported when it
// registered, and a snapshot of its WorkloadGroup taken at that moment.
//
// +kubebuilder:object:generate=true
// +groupName=runtime.onboarding.tetrate.io
package v1alpha1
