package presence

import (
	"testing"
	"time"

	"github.com/embark-mesh/embark/registry"
)

// TestDamperRule replays report sequences through the damping rule with
// explicit times and checks when each report may be stored.
func TestDamperRule(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 20, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type step struct {
		at      float64 // seconds after t0
		healthy bool
		// stored is the status stored when the report is decided (nil: none).
		stored *bool
		// wantDue is when the report may be stored, in seconds after t0;
		// -1 means at once.
		wantDue float64
	}
	yes, no := new(bool), new(bool)
	*yes = true
	tests := []struct {
		name   string
		window time.Duration
		steps  []step
	}{
		{
			name: "first report is stored at once", window: 10 * time.Second,
			steps: []step{{at: 0, healthy: false, stored: nil, wantDue: -1}},
		},
		{
			name: "first success after registration is stored at once", window: 10 * time.Second,
			steps: []step{{at: 1, healthy: true, stored: no, wantDue: -1}},
		},
		{
			name: "a single change of a steady workload is stored at once", window: 10 * time.Second,
			steps: []step{
				{at: 0, healthy: true, stored: nil, wantDue: -1},
				{at: 30, healthy: false, stored: yes, wantDue: -1},
				{at: 45, healthy: true, stored: no, wantDue: -1},
			},
		},
		{
			name: "a flip soon after another is held until it has lasted the window", window: 10 * time.Second,
			steps: []step{
				{at: 0, healthy: true, stored: nil, wantDue: -1},
				{at: 30, healthy: false, stored: yes, wantDue: -1},
				{at: 33, healthy: true, stored: no, wantDue: 43},
			},
		},
		{
			name: "flapping keeps the stored status; the lasting change is stored one window after it began", window: 10 * time.Second,
			steps: []step{
				{at: 0, healthy: true, stored: nil, wantDue: -1},
				{at: 20, healthy: false, stored: yes, wantDue: -1}, // steady before: at once
				{at: 21, healthy: true, stored: no, wantDue: 31},   // held
				{at: 22, healthy: false, stored: no, wantDue: -1},  // agrees with stored: at once, cancels the hold
				{at: 23, healthy: true, stored: no, wantDue: 33},   // held again
				{at: 24, healthy: false, stored: no, wantDue: -1},  // agrees
				{at: 25, healthy: true, stored: no, wantDue: 35},   // the lasting change
				{at: 40, healthy: true, stored: yes, wantDue: -1},  // a repeat (reconnect) of the stored status
				{at: 41, healthy: false, stored: yes, wantDue: -1}, // steady since 25: at once
				{at: 42, healthy: true, stored: no, wantDue: 52},   // flapping again: held
			},
		},
		{
			name: "a repeated report is not a flip", window: 10 * time.Second,
			steps: []step{
				{at: 0, healthy: false, stored: nil, wantDue: -1},
				{at: 1, healthy: false, stored: no, wantDue: -1},
				{at: 2, healthy: false, stored: no, wantDue: -1},
				{at: 15, healthy: true, stored: no, wantDue: -1},
			},
		},
		{
			name: "no damping", window: -1,
			steps: []step{
				{at: 0, healthy: true, stored: nil, wantDue: -1},
				{at: 1, healthy: false, stored: yes, wantDue: -1},
				{at: 2, healthy: true, stored: no, wantDue: -1},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := damper{window: tt.window}
			for i, s := range tt.steps {
				d.observe(registry.HealthReport{Healthy: s.healthy, At: at(s.at)})
				got := d.due(s.stored != nil, s.stored != nil && *s.stored)
				want := time.Time{}
				if s.wantDue >= 0 {
					want = at(s.wantDue)
				}
				if !got.Equal(want) {
					t.Errorf("step %d (t=%vs healthy=%v): due %v, want %v", i, s.at, s.healthy, got.Sub(t0), want.Sub(t0))
				}
			}
		})
	}
}
