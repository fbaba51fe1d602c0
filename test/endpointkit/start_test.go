package endpointkit

import (
	"net"
	"net/http"
	"testing"

	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

// TestStartServes checks that Start fills the listen addresses and returns
// an endpoint that serves on them, and that the configuration it was given
// is left as it was.
func TestStartServes(t *testing.T) {
	cfg := configkit.Config(env.Namespace(t))
	e := Start(t, Options{Config: cfg, Kubeconfig: env.KubeconfigPath})
	if cfg.Listen.Metrics != "" {
		t.Errorf("Start changed the given configuration's listen.metrics to %q", cfg.Listen.Metrics)
	}
	assertServes(t, e)
	e.Stop()
	if conn, err := net.Dial("tcp", e.Config.Listen.Onboarding); err == nil {
		_ = conn.Close()
		t.Errorf("onboarding address %s still accepts connections after Stop", e.Config.Listen.Onboarding)
	}
}

// TestStartPicksOtherPortsWhenOneIsTaken checks that a picked address found
// in use makes Start start again on other ones.
func TestStartPicksOtherPortsWhenOneIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", freeport.MustAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = taken.Close() })
	first := true
	pick := func() (string, error) {
		if first {
			first = false
			return taken.Addr().String(), nil
		}
		return freeport.Addr()
	}
	e := start(t, Options{Config: configkit.Config(env.Namespace(t)), Kubeconfig: env.KubeconfigPath}, pick)
	if e.Config.Listen.Onboarding == taken.Addr().String() {
		t.Fatalf("endpoint runs on the taken address %s", taken.Addr())
	}
	assertServes(t, e)
}

// assertServes checks that the endpoint's metrics listener answers.
func assertServes(t *testing.T, e *Endpoint) {
	t.Helper()
	resp, err := http.Get("http://" + e.Config.Listen.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /metrics: %s, want 200", resp.Status)
	}
}
