package configsource

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/xds"
)

// countingLists is a Cache whose List counts its calls and returns one
// Sidecar per namespace listed (every other method is unused here).
type countingLists struct {
	Cache
	lists atomic.Int32
}

func (c *countingLists) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.lists.Add(1)
	if l, ok := list.(*istionetworkingv1.SidecarList); ok {
		o := &client.ListOptions{}
		o.ApplyOptions(opts)
		l.Items = []*istionetworkingv1.Sidecar{{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: o.Namespace}}}
	}
	return nil
}

// TestPushListsEachNamespaceOnce: within one push (withListed) the
// workloads of a namespace share one read of its selecting objects (4
// kinds, in it and in the root namespace), from concurrent workers too;
// outside a push every call reads the cache.
func TestPushListsEachNamespaceOnce(t *testing.T) {
	c := &countingLists{}
	s, err := New(Options{Cache: c})
	if err != nil {
		t.Fatal(err)
	}
	proxy := func(ns string, i int) *xds.Proxy {
		group := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns}}
		p := &xds.Proxy{NodeID: ns + string(rune('a'+i)), Registration: registrationOf(t, group, nil)}
		p.Workload.Key = ktypes.NamespacedName{Namespace: ns, Name: p.Registration.Name}
		return p
	}
	var proxies []*xds.Proxy
	for i := range 10 {
		proxies = append(proxies, proxy("bookinfo", i), proxy("shop", i))
	}

	ctx := withListed(t.Context())
	var wg sync.WaitGroup
	for _, p := range proxies {
		wg.Go(func() {
			in, err := s.scopeInputs(ctx, p)
			if err != nil {
				t.Error(err)
				return
			}
			if len(in.Sidecars) != 2 || in.Sidecars[0].Namespace != p.Workload.Key.Namespace || in.Sidecars[1].Namespace != DefaultRootNamespace {
				t.Errorf("%s: Sidecars of namespaces %v, want its own and the root's", p.NodeID, in.Sidecars)
			}
		})
	}
	wg.Wait()
	if got, want := c.lists.Load(), int32(2*4*2); got != want {
		t.Errorf("one push listed %d times, want %d (2 namespaces, 4 kinds, each with the root namespace)", got, want)
	}

	c.lists.Store(0)
	for _, p := range proxies[:3] {
		if _, err := s.scopeInputs(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := c.lists.Load(), int32(3*4*2); got != want {
		t.Errorf("outside a push: %d lists, want %d (each call reads the cache)", got, want)
	}
}
