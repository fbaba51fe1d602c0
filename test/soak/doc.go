// Package soak runs the real onboarding-endpoint binary for SOAK_DURATION
// (default 10m; `make soak`) in two tests, one after the other.
//
// TestSoak (standalone mode) runs under steady onboarding and churn: agents
// onboard and hold ADS streams at a fixed rate, the oldest disconnect so
// that a steady number stays connected, and the endpoint's grace-period
// sweeper removes the disconnected ones. The replica is rolled once
// (SIGTERM, started again) at the end of the first fifth; every held agent
// reconnects and keeps its registration.
//
// TestSoakIstiodMode (istiod mode) runs SOAK_SIDECARS (default 1,000)
// simulated sidecars whose ADS streams one replica relays to a real istiod,
// with short onboarding tokens (1 min). Each sidecar renews its workload
// certificate as pilot-agent does: a CSR through Embark's CA relay with its
// sidecar token, of a lifetime of a tenth of the run (45 s to 3 min), again
// after half of it. The replica is rolled at a fifth of the run and istiod
// restarted at two fifths; every stream reconnects after the roll and is
// answered and ACKed again after istiod's restart, no certificate expires
// before its renewal, and no registration is lost or re-created.
//
// Both sample the endpoint's live heap and goroutine counts (a full
// collection first, through its -pprof listener), print the samples and fail
// when either grows beyond noise (Slope) after the faults. Build tag: soak.
package soak
