package integration

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/vmsim"
)

// scrapeAgent reads the agent's /metrics; nil while it does not answer.
func scrapeAgent(addr string) map[string]*dto.MetricFamily {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil
	}
	return fams
}

// sample is the value of name's sample with label values lv, and whether
// there is one.
func sample(fams map[string]*dto.MetricFamily, name string, lv map[string]string) (float64, bool) {
next:
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if v, ok := lv[l.GetName()]; ok && v != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		default:
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

// The built agent, with metrics.address set, serves its state on loopback:
// refused (no OnboardingPolicy) it reports not onboarded with the reason,
// onboarded it reports its tokens' expiry and the sidecar ready, always its
// version. The sidecar's readiness URL is a loopback stand-in for
// pilot-agent's status port that answers 200 once the agent's restart
// command ran.
func TestBinaryServesItsStateOnLoopback(t *testing.T) {
	bin := buildAgent(t)
	w := newWorld(t)
	w.startEndpoint() // no OnboardingPolicy yet: onboarding is refused
	root := t.TempDir()
	agentFile, onboardingFile := w.agentConfig(root, agentFiles{})

	ready := http.NewServeMux()
	ready.HandleFunc("/healthz/ready", func(rw http.ResponseWriter, _ *http.Request) {
		if countLines(filepath.Join(root, "restarts")) == 0 {
			rw.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	readyAddr := freeAddr(t)
	readySrv := &http.Server{Addr: readyAddr, Handler: ready, ReadHeaderTimeout: time.Second}
	go func() { _ = readySrv.ListenAndServe() }()
	t.Cleanup(func() { _ = readySrv.Close() })

	metricsAddr := freeAddr(t)
	f, err := os.OpenFile(agentFile, os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteString("metrics:\n  address: " + metricsAddr + "\n  sidecarReadyURL: http://" + readyAddr + "/healthz/ready\n")
	must(t, err)
	must(t, f.Close())

	logs := &vmsim.SyncBuffer{}
	cmd := exec.Command(bin, "--agent-config", agentFile, "--onboarding-config", onboardingFile)
	cmd.Stdout, cmd.Stderr = logs, logs
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("agent output:\n%s", logs.String())
		}
	})

	var fams map[string]*dto.MetricFamily
	fixtures.Eventually(t, 60*time.Second, "a refused onboarding reported", func() bool {
		fams = scrapeAgent(metricsAddr)
		v, ok := sample(fams, "embark_agent_last_onboarding_error", map[string]string{"reason": "PermissionDenied"})
		return ok && v == 1
	})
	if v, ok := sample(fams, "embark_agent_build_info", map[string]string{"version": "v9.9.9-test"}); !ok || v != 1 {
		t.Errorf("build info v9.9.9-test: %v %v", v, ok)
	}
	for _, c := range []struct {
		name string
		lv   map[string]string
		want float64
	}{
		{"embark_agent_onboarded", nil, 0},
		{"embark_agent_sidecar_ready", nil, 0},
	} {
		if v, ok := sample(fams, c.name, c.lv); !ok || v != c.want {
			t.Errorf("refused: %s = %v (present %v), want %v", c.name, v, ok, c.want)
		}
	}
	if v, ok := sample(fams, "embark_agent_onboarding_failures_total", map[string]string{"reason": "PermissionDenied"}); !ok || v < 1 {
		t.Errorf("refused: failures %v %v", v, ok)
	}
	if _, ok := sample(fams, "embark_agent_token_expiry_timestamp_seconds", nil); ok {
		t.Error("token expiry reported before onboarding")
	}

	w.allow()
	fixtures.Eventually(t, 90*time.Second, "onboarding reported", func() bool {
		fams = scrapeAgent(metricsAddr)
		v, ok := sample(fams, "embark_agent_onboarded", nil)
		return ok && v == 1
	})
	now := float64(time.Now().Unix())
	for _, token := range []string{"onboarding", "sidecar"} {
		if v, ok := sample(fams, "embark_agent_token_expiry_timestamp_seconds", map[string]string{"token": token}); !ok || v <= now {
			t.Errorf("%s token expiry %v (present %v), want after now %v", token, v, ok, now)
		}
	}
	if _, ok := sample(fams, "embark_agent_last_onboarding_error", nil); ok {
		t.Error("last onboarding error still reported once onboarded")
	}
	// The registration's status shows the version and the refusal the agent
	// reported on the Register that onboarded it.
	if regs := w.registrations(); len(regs) != 1 {
		t.Errorf("%d registrations, want 1", len(regs))
	} else if a := regs[0].Status.Agent; a == nil || a.Version != "v9.9.9-test" || a.LastError == nil ||
		a.LastError.Reason != "PermissionDenied" || !strings.Contains(a.LastError.Message, "not authorized to onboard") || a.ReportedAt == nil {
		t.Errorf("status.agent = %+v, want version v9.9.9-test and the PermissionDenied refusal", a)
	}
	fixtures.Eventually(t, 10*time.Second, "sidecar ready reported", func() bool {
		v, ok := sample(scrapeAgent(metricsAddr), "embark_agent_sidecar_ready", nil)
		return ok && v == 1
	})

	must(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agent exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not exit after SIGTERM")
	}
	if scrapeAgent(metricsAddr) != nil {
		t.Error("metrics still served after the agent exited")
	}
}
