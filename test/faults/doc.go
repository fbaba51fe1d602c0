// Package faults is Embark's fault suite (`make faults`, build tag
// faults): real onboarding-endpoint processes (test/endpointproc) and
// simulated agents holding ADS streams against a restartable test control
// plane, through an endpoint restart, the SIGKILL of the replica owning the
// streams while a second replica runs, a 60 s kube-apiserver outage during
// connects and disconnects, an etcd restart, and a rolling upgrade from the
// previous release's endpoint and CRDs (upgrade_test.go). Each test compares the
// stored registrations with the truth the agents know (who is connected,
// who left) and checks that nothing was lost or deleted early.
package faults
