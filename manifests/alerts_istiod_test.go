package manifests

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/rules"
)

// alertRun is a real run whose scrapes Prometheus' rule engine evaluates
// every alerting rule on, at each scrape's time, as a Prometheus server
// scraping every scrapeStep does.
type alertRun struct {
	*run
	rules []*rules.AlertingRule
	query rules.QueryFunc
}

func newAlertRun(t *testing.T, mode string, targets []scrapeTarget) *alertRun {
	t.Helper()
	r := newRun(t, mode, targets)
	return &alertRun{run: r, rules: alertRules(t), query: rules.EngineQueryFunc(r.p.engine, r.p.db)}
}

// phase is what the rules did during k steps of a fault: for each alert,
// the step it was first pending and first firing at (-1: never), and
// whether it is active after the last step.
type phase struct {
	name            string
	pending, firing map[string]int
	activeAfter     map[string]bool
}

// phase runs k steps: act(i) then a scrape of every target and an
// evaluation of every rule.
func (a *alertRun) phase(t *testing.T, name string, k int, act func(i int)) phase {
	t.Helper()
	p := phase{name: name, pending: map[string]int{}, firing: map[string]int{}, activeAfter: map[string]bool{}}
	for i := range k {
		if act != nil {
			act(i)
			// All requests come from 127.0.0.1: stay under the xds
			// limiter's 20 a second per source.
			time.Sleep(150 * time.Millisecond)
		}
		a.scrape(t, 1)
		for _, r := range a.rules {
			if _, err := r.Eval(t.Context(), 0, a.end, a.query, nil, 0); err != nil {
				t.Fatalf("evaluate %s: %v", r.Name(), err)
			}
			for _, al := range r.ActiveAlerts() {
				if _, ok := p.pending[r.Name()]; !ok {
					p.pending[r.Name()] = i
				}
				if _, ok := p.firing[r.Name()]; !ok && al.State == rules.StateFiring {
					p.firing[r.Name()] = i
				}
			}
		}
	}
	for _, r := range a.rules {
		if len(r.ActiveAlerts()) > 0 {
			p.activeAfter[r.Name()] = true
		}
	}
	t.Logf("%s (%d steps of %v): pending %v, firing %v, active after %v", name, k, scrapeStep, p.pending, p.firing, p.activeAfter)
	return p
}

// fires checks that alert fired in p, and not before its hold: hold after
// it went pending (in steps of scrapeStep).
func (p phase) fires(t *testing.T, alert string, hold time.Duration) {
	t.Helper()
	at, ok := p.firing[alert]
	if !ok {
		t.Errorf("%s: %s never fired (pending at step %v)", p.name, alert, p.pendingAt(alert))
		return
	}
	if held := time.Duration(at-p.pending[alert]) * scrapeStep; held < hold {
		t.Errorf("%s: %s fired %v after going pending, before its for: %v", p.name, alert, held, hold)
	}
}

func (p phase) pendingAt(alert string) string {
	if at, ok := p.pending[alert]; ok {
		return fmt.Sprint(at)
	}
	return "never"
}

// quiet checks that none of alerts was active during p.
func (p phase) quiet(t *testing.T, alerts ...string) {
	t.Helper()
	for _, a := range alerts {
		if at, ok := p.pending[a]; ok {
			t.Errorf("%s: %s active from step %d", p.name, a, at)
		}
	}
}

// The istiod-mode alerts fire on what a replica reports about a real
// istiod, not on series a test wrote: one replica relays a VM's sidecar
// stream and its certificate requests to a real istiod (test/testenv),
// its /metrics scraped into a real TSDB every 30 s of the TSDB's clock
// and every rule evaluated after each scrape by Prometheus' rule engine.
// Healthy, no alert. Refusing (istiod refuses requests that are no CSR,
// Embark refuses bad tokens): no alert, a client's mistakes are not the
// server's failures. Frozen (SIGSTOP: istiod accepts connections and
// answers nothing; each request has the 1 s deadline a sidecar's would):
// EmbarkCertificateRequestsFailing fires, after its for:, and resolves
// once istiod answers again. Stopped: EmbarkIstiodUnreachable fires after
// its for: and resolves once istiod is back. Restarted every other scrape
// (istiod ends the relayed stream each time): EmbarkRelayErrors fires after
// its for:.
func TestIstiodModeAlertsAgainstTheRealIstiod(t *testing.T) {
	ctx := t.Context()
	i, ir := startIstiodReplica(t, ctx)
	v := onboardVM(t, ctx, ir.addrs.onboarding, ir.host, ir.fixture, "172.31.5.254")
	s, err := openStream(t, ir.addrs.xds, v.bootstrap.GetSidecarToken(), v.bootstrap.GetNodeId())
	if err != nil {
		t.Fatalf("the VM's stream: %v", err)
	}
	defer s.cancel()
	waitConnected(t, ctx, v)
	token := v.bootstrap.GetSidecarToken()
	a := newAlertRun(t, "istiod", ir.targets)
	istiodAlerts := []string{"EmbarkIstiodUnreachable", "EmbarkRelayErrors", "EmbarkCertificateRequestsFailing"}
	const (
		unreachableFor = 5 * time.Minute
		errorsFor      = 10 * time.Minute
	)
	good := func(int) {
		if err := ir.ask(ctx, token, csrPEM(t)); err != nil {
			t.Errorf("certificate from a healthy istiod: %v", err)
		}
	}

	healthy := a.phase(t, "healthy", 24, good)
	healthy.quiet(t, istiodAlerts...)

	refusing := a.phase(t, "refusing", 24, func(int) {
		if err := ir.ask(ctx, token, "-----BEGIN CERTIFICATE REQUEST-----\nbm90IGEgQ1NS\n-----END CERTIFICATE REQUEST-----\n"); err == nil {
			t.Error("istiod signed a request that is no CSR")
		}
		if err := ir.ask(ctx, "not-a-token", csrPEM(t)); err == nil {
			t.Error("a request with a bad token was relayed")
		}
	})
	refusing.quiet(t, istiodAlerts...)

	i.Pause()
	frozen := a.phase(t, "frozen", 26, func(int) {
		if err := ir.askWithin(ctx, time.Second, token, csrPEM(t)); err == nil {
			t.Error("a frozen istiod signed a certificate")
		}
	})
	i.Resume()
	frozen.fires(t, "EmbarkCertificateRequestsFailing", errorsFor)
	recovered := a.phase(t, "istiod answers again", 24, good)
	if recovered.activeAfter["EmbarkCertificateRequestsFailing"] {
		t.Error("EmbarkCertificateRequestsFailing still active 12 minutes after istiod answers again")
	}

	i.Stop()
	waitMetricValue(t, ctx, ir.targets[0], "embark_istiod_connection_state", map[string]string{"state": "ready"}, 0)
	stopped := a.phase(t, "stopped", 20, nil)
	stopped.fires(t, "EmbarkIstiodUnreachable", unreachableFor)
	if err := i.Start(ctx); err != nil {
		t.Fatal(err)
	}
	back := a.phase(t, "istiod back", 4, func(int) {
		waitMetricValue(t, ctx, ir.targets[0], "embark_istiod_connection_state", map[string]string{"state": "ready"}, 1)
	})
	if back.activeAfter["EmbarkIstiodUnreachable"] {
		t.Error("EmbarkIstiodUnreachable still active with istiod back")
	}

	restarts := 0
	flapping := a.phase(t, "restarted every other scrape", 44, func(k int) {
		if k%2 != 0 {
			return
		}
		i.Stop()
		if err := i.Start(ctx); err != nil {
			t.Fatal(err)
		}
		restarts++
		waitMetricValue(t, ctx, ir.targets[0], "embark_xds_relay_upstream_streams", map[string]string{"istiod_revision": "default"}, 1)
	})
	t.Logf("istiod restarted %d times", restarts)
	flapping.fires(t, "EmbarkRelayErrors", errorsFor)

	for _, p := range []phase{healthy, refusing, frozen, recovered, stopped, back, flapping} {
		for name := range p.firing {
			if !slices.Contains(istiodAlerts, name) {
				t.Errorf("%s: %s fired, not an istiod alert", p.name, name)
			}
		}
	}
}

// waitMetricValue waits (a minute at most) until the samples of family
// name with the label values lv, scraped from tg, sum to want.
func waitMetricValue(t *testing.T, ctx context.Context, tg scrapeTarget, name string, lv map[string]string, want float64) {
	t.Helper()
	var got float64
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		got = 0
		for _, m := range fetch(t, tg)[name].GetMetric() {
			match := true
			for k, v := range lv {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
					match = false
				}
			}
			if match {
				got += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		if got == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s%v = %v after a minute, want %v", name, lv, got, want)
}
