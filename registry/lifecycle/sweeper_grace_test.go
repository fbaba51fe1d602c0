package lifecycle

import (
	"testing"
	"time"

	"github.com/embark-mesh/embark/registry/replica"
)

// After an API server outage every replica Lease has expired (nobody could
// renew one) and the sweeper's own term began anew: an expired Lease proves
// its replica gone only once the replica had a full Lease duration, from the
// start of the term, to renew it.
func TestSweeperReplicaStateAfterLeadingStarts(t *testing.T) {
	start := time.Date(2026, 11, 25, 7, 0, 0, 0, time.UTC)
	const grace = 40 * time.Second
	expired := replica.State{Found: true, Expiry: start.Add(-20 * time.Second), Started: start.Add(-time.Hour)}
	alive := replica.State{Found: true, Alive: true, Expiry: start.Add(30 * time.Second), Started: start.Add(-time.Hour)}
	tests := []struct {
		name       string
		st         replica.State
		led        time.Duration // how long the sweeper has led
		wantAlive  bool
		wantExpiry time.Time
	}{
		{name: "expired Lease right after leading started", st: expired, led: 0, wantAlive: true, wantExpiry: start.Add(grace)},
		{name: "expired Lease within the grace", st: expired, led: grace - time.Second, wantAlive: true, wantExpiry: start.Add(grace)},
		{name: "expired Lease at the end of the grace", st: expired, led: grace, wantAlive: false, wantExpiry: expired.Expiry},
		{name: "expired Lease after the grace", st: expired, led: time.Hour, wantAlive: false, wantExpiry: expired.Expiry},
		{name: "live Lease", st: alive, led: 0, wantAlive: true, wantExpiry: alive.Expiry},
		// Deleted on clean shutdown: gone at once, no grace.
		{name: "no Lease", st: replica.State{}, led: 0, wantAlive: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &sweeper{leaseGrace: grace, leadingSince: start, now: func() time.Time { return start.Add(tt.led) }}
			got := s.replicaState(tt.st)
			if got.Alive != tt.wantAlive || !got.Expiry.Equal(tt.wantExpiry) {
				t.Errorf("replicaState = alive %v, expiry %v; want alive %v, expiry %v", got.Alive, got.Expiry, tt.wantAlive, tt.wantExpiry)
			}
			if got.Found != tt.st.Found || !got.Started.Equal(tt.st.Started) {
				t.Errorf("replicaState changed Found or Started: %+v from %+v", got, tt.st)
			}
		})
	}
}
