package presence

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	istioapi "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/testenv"
)

// The registrar makes the registrations whose presence these tests write:
// real registrations and WorkloadEntries in a real API server.
var (
	env    *testenv.Env
	cached cache.Cache
)

// TestMain fails the package when a goroutine (a connection or health
// writer) outlives the tests.
func TestMain(m *testing.M) {
	os.Exit(testenv.CheckLeaks(testenv.Run(m, testenv.Options{GarbageCollector: true}, &env, func(ctx context.Context) error {
		var err error
		cached, err = env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) },
			&istionetworkingv1.WorkloadEntryList{}) // the informer the registrar reads
		return err
	})))
}

func newRegistrar(t *testing.T, c client.Client) *registry.Registrar {
	t.Helper()
	if c == nil {
		c = env.Client
	}
	r, err := registry.NewRegistrar(registry.Options{
		Client: c, Cache: cached,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// createGroup creates the seed 004 ratings WorkloadGroup in ns, and the
// service account it names.
func createGroup(t *testing.T, ns string) *istionetworkingv1.WorkloadGroup {
	t.Helper()
	wg := &istionetworkingv1.WorkloadGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns, Labels: map[string]string{"app": "ratings"}},
	}
	wg.Spec.Template = &istioapi.WorkloadEntry{
		Labels:         map[string]string{"app": "ratings", "class": "vm"},
		ServiceAccount: "ratings-vm",
		Network:        "virtual-machines",
		Ports:          map[string]uint32{"http": 8080},
	}
	if err := env.Client.Create(t.Context(), wg); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm", Namespace: ns}}
	if err := env.Client.Create(t.Context(), sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return wg
}

func ec2Identity(instance string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{
		Partition: "aws", Account: "123456789012", Region: "us-east-2", Zone: "us-east-2b",
		EC2: &runtimev1alpha1.EC2Identity{InstanceID: instance},
	}}
}

func registration(ip string) runtimev1alpha1.Registration {
	return runtimev1alpha1.Registration{
		Agent:    runtimev1alpha1.AgentInfo{Version: "v1.4.0"},
		Host:     runtimev1alpha1.HostInfo{Addresses: []runtimev1alpha1.HostAddress{{IP: ip, Type: runtimev1alpha1.AddressTypeVPC}}},
		Settings: runtimev1alpha1.Settings{ConnectedOver: runtimev1alpha1.AddressTypeVPC},
		Sidecar:  runtimev1alpha1.SidecarInfo{Istio: runtimev1alpha1.IstioSidecarInfo{Version: "1.9.8-15bc6e5e32"}},
		Workload: runtimev1alpha1.WorkloadInfo{Labels: map[string]string{"version": "v5"}},
	}
}

func waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("%s still exists: %v", obj.GetName(), err)
	}
}
