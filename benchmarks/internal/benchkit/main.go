package benchkit

import (
	"context"
	"fmt"
	"testing"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/testenv"
)

// Cluster is what a benchmark's TestMain starts: the control plane, an
// informer cache of WorkloadEntries, registrations and Secrets indexed as
// the registry needs, and a clientset (for TokenReviews).
type Cluster struct {
	Env       *testenv.Env
	Informers crcache.Cache
	Clientset *kubernetes.Clientset
}

// Main is the body of TestMain for benchmarks that register workloads and
// serve xDS: it starts the control plane with the garbage collector (so
// that deleting a registration removes what it owns), fills c, runs the
// benchmarks and exits.
func Main(m *testing.M, c *Cluster) {
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &c.Env, c.start)
}

// start fills the informer cache and the clientset once the control plane
// runs.
func (c *Cluster) start(ctx context.Context) error {
	var err error
	c.Informers, err = c.Env.StartCache(ctx, func(cc crcache.Cache) error { return registry.SetupIndexes(ctx, cc) },
		&istionetworkingv1.WorkloadEntryList{}, &runtimev1alpha1.WorkloadAutoRegistrationList{}, &corev1.SecretList{})
	if err != nil {
		return fmt.Errorf("start informer cache: %w", err)
	}
	if c.Clientset, err = kubernetes.NewForConfig(c.Env.Config); err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	return nil
}
