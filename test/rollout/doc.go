// Package rollout proves WorkloadGroupRollout end to end: ten simulated EC2
// instances, each running the real onboarding agent (package
// onboarding/agent) with a real pilot-agent (test/istioagent, Envoy
// disabled) as its sidecar, onboard into the real onboarding endpoint
// (cmd/onboarding-endpoint/app) against a real kube-apiserver and etcd; the
// WorkloadGroup changes and the endpoint's rollout controller re-onboards
// them two at a time. Fakes stand only at true edges: AWS IMDS/STS on
// loopback (awstest, through the real SDK), systemd (a unit on a unix
// socket runs the agent's restart and stop commands), and Envoy (a gRPC
// client on pilot-agent's XDS socket), of which no binary exists here.
package rollout
