// Package integration tests package token against a real kube-apiserver and
// etcd (test/testenv): creating the signing-key Secret from concurrent
// replicas, following rotations through the informer, keeping the keys when
// the Secret goes bad, and the kubectl rotation procedure of
// docs/onboarding-token.md. It holds no code but its tests; they live apart
// from package token so that its unit tests, benchmarks and fuzz target run
// without a control plane.
package integration
