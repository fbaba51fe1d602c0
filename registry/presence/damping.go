package presence

import (
	"time"

	"github.com/embark-mesh/embark/registry"
)

// DefaultHealthDamping is the default damping window of health flips.
const DefaultHealthDamping = 10 * time.Second

// damper decides when a workload's reported health may be stored. The rule,
// for a damping window W:
//
//   - A report that agrees with the stored status is stored at once (it
//     updates lastProbeTime and the message; no transition). It also cancels
//     a held flip.
//   - A report that flips the stored status (or the first report, when no
//     status is stored) is stored at once when the reports were steady
//     before it: the report before this run of equal reports changed the
//     status at least W earlier, or never did.
//   - Otherwise (the reports changed status less than W before this flip: the
//     workload is flapping) the flip is held, and stored only once the
//     reports have said the new status for W without interruption, i.e. at
//     the first report of the run + W, when no contrary report came meanwhile.
//
// So a single change of a steady workload is stored at once, a flapping
// workload keeps its stored status, and a lasting change is stored at most W
// after it began. W <= 0 disables damping.
type damper struct {
	window time.Duration
	// known is false until the first report.
	known bool
	// status is the status of the latest report.
	status bool
	// runStart is when the reports began to say status (the first report of
	// the current run of equal reports).
	runStart time.Time
	// prevFlip is when the run before the current one began; zero when the
	// reports never changed status.
	prevFlip time.Time
}

// observe records a report.
func (d *damper) observe(h registry.HealthReport) {
	if d.known && d.status == h.Healthy {
		return
	}
	if d.known {
		d.prevFlip = d.runStart
	}
	d.known, d.status, d.runStart = true, h.Healthy, h.At
}

// due returns when the latest report may be stored, given the stored status
// (storedKnown false: none stored yet). The zero time means at once.
func (d *damper) due(storedKnown, stored bool) time.Time {
	if d.window <= 0 || !d.known || (storedKnown && stored == d.status) {
		return time.Time{}
	}
	if d.prevFlip.IsZero() || d.runStart.Sub(d.prevFlip) >= d.window {
		return time.Time{}
	}
	return d.runStart.Add(d.window)
}
