package istiod

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/meshkit"
	"github.com/embark-mesh/embark/test/testenv"
)

var (
	env    *testenv.Env
	istiod *testenv.Istiod
)

// Clean-up timing of the test istiod: it deletes the entries it takes for its
// own once istio.io/disconnectedAt is older than cleanupGrace (checked every
// 10 × cleanupGrace), or istio.io/connectedAt older than 1.5 × maxConnAge.
const (
	cleanupGrace = 500 * time.Millisecond
	maxConnAge   = 2 * time.Second
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &env, func(ctx context.Context) error {
		var err error
		istiod, err = testenv.StartIstiod(ctx, env, testenv.IstiodOptions{
			MaxConnectionAge: maxConnAge, WorkloadEntryGracePeriod: cleanupGrace,
		})
		if err != nil {
			return err
		}
		context.AfterFunc(ctx, func() { _ = istiod.Close() })
		return nil
	})
}

// endpoint is one onboarding endpoint (app.Run) configured with the test
// istiod.
type endpoint struct {
	xds      string
	metrics  string // the /metrics listener's address
	rootFile string // PEM root of the endpoint's xDS serving certificate
	// stop shuts the endpoint down as a SIGTERM does (its streams closed,
	// states flushed) and waits for it; the test's clean-up calls it too.
	stop func()
}

// startEndpoint runs the endpoint for ns with istiod configured; its xDS
// listener serves TLS with a certificate for 127.0.0.1 (what a VM's
// pilot-agent verifies), the onboarding API plaintext.
func startEndpoint(t *testing.T, ns string) *endpoint {
	t.Helper()
	return startEndpointAs(t, ns, "replica-"+ns)
}

// startEndpointAs is startEndpoint with the replica's name.
func startEndpointAs(t *testing.T, ns, replica string) *endpoint {
	t.Helper()
	return startEndpointWith(t, ns, replica, istiod)
}

// startEndpointWith is startEndpointAs with istiod i.
func startEndpointWith(t *testing.T, ns, replica string, istiod *testenv.Istiod) *endpoint {
	t.Helper()
	dir := t.TempDir()
	istiodRoots := filepath.Join(dir, "istiod-root-cert.pem")
	if err := os.WriteFile(istiodRoots, istiod.RootCert, 0o600); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, rootFile := meshkit.ServingCert(t, dir)
	cfg := configkit.Serving(configkit.Config(ns), certFile, keyFile)
	cfg.Registration.GracePeriod = configkit.Duration(time.Hour)
	cfg.Istiod = config.Istiod{Address: istiod.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: istiodRoots}
	ep := endpointkit.Start(t, endpointkit.Options{Config: cfg, Kubeconfig: env.KubeconfigPath, Replica: replica, Dir: dir})
	return &endpoint{xds: ep.Config.Listen.XDS, metrics: ep.Config.Listen.Metrics, rootFile: rootFile, stop: ep.Stop}
}

// ratingsGroup creates the example ratings WorkloadGroup (with a readiness
// probe), its service account and the ratings Service that selects it.
func ratingsGroup(t *testing.T, ns string) *istionetworkingv1.WorkloadGroup {
	t.Helper()
	wg := fixtures.WorkloadGroup(ns, map[string]string{"app": "ratings", "version": "v5"})
	wg.Spec.Metadata = &istioapi.WorkloadGroup_ObjectMeta{Labels: map[string]string{"app": "ratings", "version": "v5"}}
	wg.Spec.Template.Network, wg.Spec.Template.Ports = "virtual-machines", map[string]uint32{"http": 9080}
	wg.Spec.Probe = &istioapi.ReadinessProbe{PeriodSeconds: 1, HealthCheckMethod: &istioapi.ReadinessProbe_HttpGet{HttpGet: &istioapi.HTTPHealthCheckConfig{Path: "/ready", Port: 9080}}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "ratings"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)}},
	}}
	if err := env.Client.Create(t.Context(), svc); err != nil {
		t.Fatal(err)
	}
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	return wg
}
