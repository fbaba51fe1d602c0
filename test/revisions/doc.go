// Package revisions tests one Embark serving two istiod revisions at once, as
// in an Istio canary upgrade: a default istiod and a canary one (REVISION=
// canary) run against the same API server and share istiod's CA (the
// istio-ca-secret of their namespace, as two revisions of one mesh do), and
// real pilot-agents are relayed through Embark. Relabelling the workloads'
// namespace moves each VM's upstream stream to the canary istiod (istioctl
// proxy-status against each istiod says which serves it) without closing its
// ADS stream to Embark, without an AgentConnected change and without
// onboarding again; its certificate requests go to the canary's CA; rolling
// the label back moves it back.
package revisions
