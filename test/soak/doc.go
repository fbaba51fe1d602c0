// Package soak runs the real onboarding-endpoint binary for SOAK_DURATION
// (default 10m; `make soak`) under steady onboarding and churn: agents
// onboard and hold ADS streams at a fixed rate, the oldest disconnect so
// that a steady number stays connected, and the endpoint's grace-period
// sweeper removes the disconnected ones. The replica is rolled once (SIGTERM,
// started again) at the end of the first fifth; every held agent reconnects
// and keeps its registration. It samples the endpoint's heap
// and goroutine counts from its /metrics, prints the samples and fails
// when either grows beyond noise (Slope). Build tag: soak.
package soak
