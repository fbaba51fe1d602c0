package cacerts

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	"github.com/embark-mesh/embark/test/freeport"
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
	certFile, keyFile, e.rootFile = servingCert(t, dir)
	cfg := fmt.Sprintf(`apiVersion: config.onboarding.tetrate.io/v1alpha1
kind: OnboardingEndpointConfiguration
namespace: %s
endpoint:
  hosts: [onboarding-endpoint.example.corp]
  certFile: %s
  keyFile: %s
registration:
  gracePeriod: 1h
istiod:
  address: %s
  serverName: %s
  rootCertFile: %s
listen:
  onboarding: %s
  metrics: %s
  xds: %s
  repository: %s
`, ns, certFile, keyFile, istiod.SecureGRPCAddr, testenv.IstiodServerName, e.istiodRoots,
		freeport.MustAddr(t), freeport.MustAddr(t), e.xds, freeport.MustAddr(t))
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- app.Run(ctx, app.Options{ConfigFile: file, Kubeconfig: env.KubeconfigPath, Replica: "replica-" + ns, DebugXDS: "off",
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("endpoint: %v", err)
	case <-time.After(2 * time.Minute):
		cancel()
		t.Fatal("endpoint not ready")
	}
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("endpoint returned %v after shutdown", err)
				}
			case <-time.After(time.Minute):
				t.Error("endpoint did not stop")
			}
		})
	})
	return e
}
