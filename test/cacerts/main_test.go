package cacerts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/meshkit"
	"github.com/embark-mesh/embark/test/testenv"
)

var (
	env    *testenv.Env
	istiod *testenv.Istiod
	// plugged is the plugged-in CA istiod starts with: its root R1 and the
	// intermediate I1 it signs with, written to cacertsDir.
	plugged struct {
		root, inter *authority
	}
	cacertsDir string
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &env, func(ctx context.Context) error {
		dir, err := os.MkdirTemp("", "embark-cacerts-")
		if err != nil {
			return fmt.Errorf("create cacerts dir: %w", err)
		}
		cacertsDir = dir
		context.AfterFunc(ctx, func() { _ = os.RemoveAll(dir) })
		if plugged.root, err = newAuthority("root R1", nil); err != nil {
			return err
		}
		if plugged.inter, err = newAuthority("intermediate I1", plugged.root); err != nil {
			return err
		}
		if err := writeCACerts(dir, plugged.inter, plugged.root); err != nil {
			return err
		}
		// ISTIO_MULTIROOT_MESH lets istiod take a root-cert.pem that adds
		// roots to, or removes roots from, the one it runs with.
		istiod, err = testenv.StartIstiod(ctx, env, testenv.IstiodOptions{
			CACertsDir: dir, Env: []string{"ISTIO_MULTIROOT_MESH=true"},
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
	rootFile string // PEM root of the endpoint's xDS serving certificate
	// istiodRoots is the file of istiod's roots the endpoint verifies
	// istiod with (istiod.rootCertFile; in a cluster, the ConfigMap
	// istio-ca-root-cert mounted): the endpoint reads it again when it
	// changes.
	istiodRoots string
}

// startEndpoint runs the endpoint for ns with istiod configured; its xDS
// listener serves TLS with a certificate for 127.0.0.1 (what a VM's
// pilot-agent verifies), the onboarding API plaintext.
func startEndpoint(t *testing.T, ns string) *endpoint {
	t.Helper()
	dir := t.TempDir()
	e := &endpoint{xds: freeport.MustAddr(t), istiodRoots: filepath.Join(dir, "istiod-root-cert.pem")}
	// istiod's roots now, which earlier tests may have rotated: what the
	// kubelet mounts of the ConfigMap.
	var cm corev1.ConfigMap
	if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: testenv.IstiodNamespace, Name: "istio-ca-root-cert"}, &cm); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.istiodRoots, []byte(cm.Data["root-cert.pem"]), 0o600); err != nil {
		t.Fatal(err)
	}
	var certFile, keyFile string
	certFile, keyFile, e.rootFile = meshkit.ServingCert(t, dir)
	cfg := configkit.Serving(configkit.Config(ns), certFile, keyFile)
	cfg.Registration.GracePeriod = configkit.Duration(time.Hour)
	cfg.Istiod = config.Istiod{Address: istiod.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: e.istiodRoots}
	cfg.Listen.XDS = e.xds
	endpointkit.Start(t, endpointkit.Options{Config: cfg, Kubeconfig: env.KubeconfigPath, Replica: "replica-" + ns, Dir: dir})
	return e
}
