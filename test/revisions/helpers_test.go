package revisions

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/metadata"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/meshkit"
	"github.com/embark-mesh/embark/test/testenv"
)

// endpoint is one onboarding endpoint (app.Run) serving both revisions.
type endpoint struct {
	xds      string
	metrics  string
	rootFile string // PEM root of the endpoint's xDS serving certificate
}

// startEndpoint runs the endpoint for ns with def as the default revision's
// istiod and canary as istiod.revisions' "canary".
func startEndpoint(t *testing.T, ns string) *endpoint {
	t.Helper()
	dir := t.TempDir()
	istiodRoots := filepath.Join(dir, "istiod-root-cert.pem")
	if err := os.WriteFile(istiodRoots, def.RootCert, 0o600); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, rootFile := meshkit.ServingCert(t, dir)
	cfg := configkit.Serving(configkit.Config(ns), certFile, keyFile)
	cfg.Registration.GracePeriod = configkit.Duration(time.Hour)
	cfg.Istiod = config.Istiod{
		Address: def.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: istiodRoots,
		Revisions: []config.IstiodRevision{{Name: "canary", Address: canary.SecureGRPCAddr, ServerName: testenv.IstiodServerName}},
	}
	ep := endpointkit.Start(t, endpointkit.Options{Config: cfg, Kubeconfig: env.KubeconfigPath, Replica: "replica-" + ns, Dir: dir})
	return &endpoint{xds: ep.Config.Listen.XDS, metrics: ep.Config.Listen.Metrics, rootFile: rootFile}
}

// workload is a registered VM.
type workload struct{ *meshkit.VM }

// register registers VM n of wg through the registry, as the onboarding
// endpoint does; its address is 10.0.7.n.
func register(t *testing.T, wg *istionetworkingv1.WorkloadGroup, n int) *workload {
	t.Helper()
	return &workload{meshkit.Register(t, env, wg, n, fmt.Sprintf("10.0.7.%d", n))}
}

// connection is what the registration records of the workload's connection.
type connection struct {
	uid          string
	revision     string // AnnotationIstioRevision
	cond         metav1.Condition
	connectedAt  *metav1.Time
	disconnected bool
}

// connectionOf reads what the registration of w records; ok is false while
// it is not AgentConnected.
func connectionOf(t *testing.T, w *workload) (connection, bool) {
	t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), w.Key, war); err != nil {
		t.Fatal(err)
	}
	c := connection{uid: string(war.UID), revision: war.Annotations[registry.AnnotationIstioRevision]}
	cond := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
	if cond == nil || cond.Status != metav1.ConditionTrue || war.Status.Connection == nil {
		return c, false
	}
	c.cond, c.connectedAt, c.disconnected = *cond, war.Status.Connection.ConnectedAt, war.Status.Connection.DisconnectedAt != nil
	return c, true
}

// entryRevision is the revision annotation of w's WorkloadEntry
// (registry.AnnotationIstioRevision), and whether it has one; ok is false
// too when the entry or its endpoint carries istio.io/rev, which would hide
// it from the istiods of other revisions.
func entryRevision(t *testing.T, w *workload) (string, bool) {
	t.Helper()
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), w.Key, we); err != nil {
		t.Fatal(err)
	}
	_, labelled := we.Labels[registry.LabelRevision]
	_, specLabelled := we.Spec.Labels[registry.LabelRevision]
	if labelled || specLabelled {
		return "(labelled istio.io/rev)", false
	}
	rev, ok := we.Annotations[registry.AnnotationIstioRevision]
	return rev, ok
}

// splitColumns splits a tabwriter row: columns are at least two spaces
// apart; age strips the ages istioctl prints in some columns.
var (
	splitColumns = regexp.MustCompile(`\s{2,}`)
	age          = regexp.MustCompile(`\s\(\d+(\.\d+)?[a-z]+\)`)
)

// proxyStatus runs `istioctl proxy-status` against i (revision rev) and
// returns the row of name (nil when i does not list it).
func proxyStatus(t *testing.T, i *testenv.Istiod, rev, name string) (map[string]string, string) {
	t.Helper()
	args := []string{"proxy-status", "--xds-address", i.GRPCAddr, "--plaintext", "-r", rev}
	out, err := istioagent.Istioctl(t.Context(), t, args...)
	if err != nil {
		t.Fatalf("istioctl %v: %v\n%s", args, err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	header := splitColumns.Split(strings.TrimSpace(lines[0]), -1)
	for _, l := range lines[1:] {
		row := splitColumns.Split(strings.TrimSpace(age.ReplaceAllString(l, "")), -1)
		if len(row) > 0 && row[0] == name {
			m := map[string]string{}
			for k, h := range header {
				if k < len(row) {
					m[h] = row[k]
				}
			}
			return m, out
		}
	}
	return nil, out
}

// configHolds reports whether istiod i holds the WorkloadEntry of w in its
// configuration (its /debug/configz): whether it takes the entry for its
// revision.
func configHolds(t *testing.T, i *testenv.Istiod, w *workload) bool {
	t.Helper()
	resp, err := http.Get("http://" + i.HTTPAddr + "/debug/configz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var configs []struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &configs); err != nil {
		t.Fatalf("istiod's /debug/configz: %v\n%.500s", err, body)
	}
	for _, c := range configs {
		if c.Kind == "WorkloadEntry" && c.Metadata.Name == w.Key.Name && c.Metadata.Namespace == w.Key.Namespace {
			return true
		}
	}
	return false
}

// issued is the number of certificates istiod i's CA issued (its
// citadel_server_success_cert_issuance_count).
func issued(t *testing.T, i *testenv.Istiod) float64 {
	t.Helper()
	resp, err := http.Get("http://" + i.MonitoringAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, "citadel_server_success_cert_issuance_count") {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// requestCertificate asks Embark's certificate service for a certificate,
// with w's sidecar token, as pilot-agent does.
func requestCertificate(t *testing.T, e *endpoint, w *workload) error {
	t.Helper()
	conn := meshkit.Dial(t, e.xds, e.rootFile)
	defer conn.Close()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"embark test"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+w.Token), 30*time.Second)
	defer cancel()
	_, err = securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{
		Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), ValidityDuration: 3600,
	})
	return err
}

// metric is the sum of name's samples whose labels include want.
func metric(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	sum := 0.0
next:
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
				continue next
			}
		}
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum
}
