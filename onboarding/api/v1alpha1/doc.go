// Package onboardingv1alpha1 is the onboarding API's gRPC service and messages
// (OnboardingService: Authorize, Register, Unregister, RenewSidecarToken),
// generated from onboarding.proto; docs/api.md describes them.
package onboardingv1alpha1
