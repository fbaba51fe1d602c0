// Package endpointproc runs the real onboarding-endpoint binary as separate
// processes against a test control plane, and drives simulated EC2 agents
// against them, for the fault suite (test/faults) and the soak (test/soak):
// it builds the binary, writes each replica's configuration, starts,
// stops (SIGTERM) and kills (SIGKILL) replicas, scrapes their metrics, and
// runs agents that onboard through the gRPC API and then hold an ADS stream
// with their sidecar token, reconnecting to the next replica when a stream
// breaks, like Istio's agent does.
package endpointproc
