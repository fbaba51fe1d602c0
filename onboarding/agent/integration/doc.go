// Package integration tests the onboarding agent (package agent, in-process,
// and the built cmd/onboarding-agent binary) against the real onboarding
// endpoint (cmd/onboarding-endpoint/app) on a real kube-apiserver and etcd
// (test/testenv), with loopback AWS IMDS and STS fakes behind the real SDK:
// first onboarding, token renewal, re-onboarding after `kubectl delete war`,
// the endpoint down for a while, a policy missing then added, and graceful
// shutdown. It holds no code but its tests.
package integration
