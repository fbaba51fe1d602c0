// Package authorize benchmarks the CPU-bound half of an onboarding: the
// verification of an EC2 instance identity document (RSA-2048 PKCS#7) and
// the evaluation of the OnboardingPolicies that select the WorkloadGroup,
// read from an informer cache of a real kube-apiserver + etcd, on every
// core at once. It reports operations per second per core next to a raw
// RSA-2048 PKCS#1 v1.5 verification on every core, measured in the same run.
// AuthorizeScale does it as the endpoint does, document and STS-proof
// paths, with 1 and with 1,000 OnboardingPolicies in the namespace.
//
//	go test -run='^$' -bench=. ./benchmarks/authorize/
package authorize
