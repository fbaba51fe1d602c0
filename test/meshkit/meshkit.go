// Package meshkit holds the set-up shared by the tests that run Embark
// beside a real istiod (test/istiod, test/cacerts, test/multinetwork,
// test/revisions): a VM registered through the registry, the VM's real
// pilot-agent connected to the onboarding endpoint with that VM's token,
// and the endpoint's metrics read as Prometheus reads them.
package meshkit

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	meshconfig "istio.io/api/mesh/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/xds/upstream"
)

// VM is a registered VM.
type VM struct {
	// Key names its WorkloadAutoRegistration (and its WorkloadEntry).
	Key client.ObjectKey
	// UID is the registration's UID.
	UID string
	// IP is the VM's address.
	IP string
	// Token is the sidecar token the registry issued for it.
	Token string
	// NodeID is its sidecar's xDS node ID.
	NodeID string
	// Entry is the WorkloadEntry the registry wrote.
	Entry *istionetworkingv1.WorkloadEntry
}

// Register registers VM n of wg at ip through the registry of env, as the
// onboarding endpoint does: its identity is the EC2 instance i-<n in hex>.
func Register(t *testing.T, env *testenv.Env, wg *istionetworkingv1.WorkloadGroup, n int, ip string) *VM {
	t.Helper()
	ctx := t.Context()
	c, err := env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) }, &istionetworkingv1.WorkloadEntryList{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity(fmt.Sprintf("i-%017x", n)), Registration: fixtures.Registration(ip)})
	if err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(res.Registration)
	return &VM{Key: key, UID: string(res.Registration.UID), IP: ip, Token: res.SidecarToken.Token,
		NodeID: fixtures.NodeID(ip, key), Entry: res.WorkloadEntry}
}

// StartSidecar starts vm's real pilot-agent until the test ends, as the
// onboarding agent configures it: discovery (and CA) at xds over mutual TLS
// with the root in rootFile (also the CA's root, CA_ROOT_CA, as cluster.env
// names it), vm's pod name, namespace, address, service account and token. The other fields of opts (labels, environment, Envoy
// stand-in, resolv.conf) are passed on as they are; a ProxyConfig in opts
// replaces the mutual-TLS one.
func StartSidecar(t *testing.T, xds, rootFile string, vm *VM, opts istioagent.Options) *istioagent.Agent {
	t.Helper()
	roots, err := os.ReadFile(rootFile)
	if err != nil {
		t.Fatal(err)
	}
	opts.DiscoveryAddress, opts.XDSRootCA, opts.Token = xds, roots, vm.Token
	opts.PodName, opts.PodNamespace, opts.InstanceIP = vm.Key.Name, vm.Key.Namespace, vm.IP
	opts.ServiceAccount = fixtures.ServiceAccount
	if opts.ProxyConfig == nil {
		opts.ProxyConfig = &meshconfig.ProxyConfig{ControlPlaneAuthPolicy: meshconfig.AuthenticationPolicy_MUTUAL_TLS}
	}
	return istioagent.Start(t, opts)
}

// Scrape reads the metrics served at addr (host:port) on /metrics.
func Scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// ServingCert writes the endpoint's xDS serving certificate for 127.0.0.1
// and its key to dir/tls.crt and dir/tls.key, signed by a new CA whose
// certificate it writes to dir/ca.crt (rootFile): what a VM trusts for the
// endpoint.
func ServingCert(t *testing.T, dir string) (certFile, keyFile, rootFile string) {
	t.Helper()
	ca, err := fixtures.NewCA("embark test root")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err = ca.ServingCert(dir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	rootFile = filepath.Join(dir, "ca.crt")
	if err := ca.WritePEM(rootFile); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, rootFile
}

// Listeners opens the sidecar's ADS stream to Embark through agent's xDS
// proxy, asks for listeners as Envoy's first request does and ACKs the
// first response, which it returns with the stream; ctx bounds the wait
// for that response.
func Listeners(t *testing.T, ctx context.Context, agent *istioagent.Agent) (*istioagent.Client, *discovery.DiscoveryResponse) {
	t.Helper()
	ads, err := istioagent.Connect(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := ads.Send(resource.ListenerType, nil, "", ""); err != nil {
		t.Fatal(err)
	}
	resp, err := ads.Recv(ctx)
	if err != nil {
		t.Fatalf("no listeners through pilot-agent: %v\n%s", err, Tail(agent.Logs()))
	}
	if err := ads.ACK(resp); err != nil {
		t.Fatal(err)
	}
	return ads, resp
}

// OpenSDS opens an SDS stream for name on agent's socket, as Envoy does,
// once the socket exists (within a minute), and sends the first request;
// the test fails otherwise. The connection is closed when the test ends.
func OpenSDS(t *testing.T, ctx context.Context, agent *istioagent.Agent, node *core.Node, name string) secretv3.SecretDiscoveryService_StreamSecretsClient {
	t.Helper()
	st, closeConn, err := DialSDS(ctx, agent, node, name)
	if err != nil {
		t.Fatalf("%v\npilot-agent log:\n%s", err, Tail(agent.Logs()))
	}
	t.Cleanup(closeConn)
	return st
}

// DialSDS is OpenSDS for goroutines other than the test's (which must not
// call t.Fatal or t.Cleanup): it returns the error, and the caller closes
// the connection with closeConn.
func DialSDS(ctx context.Context, agent *istioagent.Agent, node *core.Node, name string) (st secretv3.SecretDiscoveryService_StreamSecretsClient, closeConn func(), err error) {
	conn, err := grpc.NewClient("unix://"+agent.SDSSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("SDS client: %w", err)
	}
	closeConn = func() { _ = conn.Close() }
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		if _, err := os.Stat(agent.SDSSocket()); err != nil {
			return false, nil
		}
		st, err = secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
		return err == nil, nil
	})
	if err != nil {
		closeConn()
		return nil, nil, fmt.Errorf("no SDS socket at %s: %w", agent.SDSSocket(), err)
	}
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.SecretType, ResourceNames: []string{name}}); err != nil {
		closeConn()
		return nil, nil, fmt.Errorf("first SDS request: %w", err)
	}
	return st, closeConn, nil
}

// Tail is the last 4000 bytes of a log, what a failure message shows of it.
func Tail(log string) string {
	if len(log) > 4000 {
		return log[len(log)-4000:]
	}
	return log
}

// Dial connects to the endpoint's xDS listener at xds (which also serves
// the certificate service) over TLS, trusting the root in rootFile for
// 127.0.0.1, as a VM's pilot-agent does; the connection is closed when the
// test ends at the latest.
func Dial(t *testing.T, xds, rootFile string) *grpc.ClientConn {
	t.Helper()
	roots, err := upstream.NewRoots(rootFile, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(xds, grpc.WithTransportCredentials(credentials.NewTLS(roots.ClientConfig("127.0.0.1"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
