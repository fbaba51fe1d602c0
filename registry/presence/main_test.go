package presence

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// The group, identity and registration of these tests are test/fixtures':
// the example ratings group (fixtures.SeedGroup), the simulated EC2
// instance (fixtures.AWSIdentity) and a VM's host (fixtures.Registration).
