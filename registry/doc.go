// Package registry will own the lifecycle of WorkloadAutoRegistration and
// Istio WorkloadEntry resources: naming, the WorkloadGroup snapshot,
// connect/disconnect state, grace-period removal, replica ownership and health
// mirroring. It is the only package that writes these resources.
//
// Nothing is implemented here yet; see the onboarding-endpoint and xDS issues.
package registry
