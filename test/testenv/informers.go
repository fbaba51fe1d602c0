package testenv

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StartCache starts an informer cache over the control plane that lives as
// long as ctx. setup (if not nil) runs before the cache starts, e.g. to add
// field indexes; the informers of warm are started and synced before it
// returns, so that tests do not race the first List.
func (e *Env) StartCache(ctx context.Context, setup func(cache.Cache) error, warm ...client.ObjectList) (cache.Cache, error) {
	return e.StartCacheIn(ctx, nil, setup, warm...)
}

// StartCacheIn is StartCache watching only the given namespaces (none: all),
// as a replica with workloadNamespaces does: a test that counts what changes
// of its own namespace cause is then not disturbed by other tests' objects
// (their namespaces' deletion reaches a cluster-wide cache seconds later).
func (e *Env) StartCacheIn(ctx context.Context, namespaces []string, setup func(cache.Cache) error, warm ...client.ObjectList) (cache.Cache, error) {
	opts := cache.Options{Scheme: e.Scheme}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	c, err := cache.New(e.Config, opts)
	if err != nil {
		return nil, fmt.Errorf("create cache: %w", err)
	}
	if setup != nil {
		if err := setup(c); err != nil {
			return nil, err
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return nil, errors.New("cache did not start")
	}
	for _, l := range warm {
		if err := c.List(ctx, l); err != nil {
			return nil, fmt.Errorf("sync informer for %T: %w", l, err)
		}
	}
	return c, nil
}

// EventRecorder returns a recorder that writes core/v1 Events to the control
// plane until ctx ends, as the endpoint's recorder does.
func (e *Env) EventRecorder(ctx context.Context, component string) (record.EventRecorder, error) {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return nil, fmt.Errorf("create clientset: %w", err)
	}
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	return b.NewRecorder(e.Scheme, corev1.EventSource{Component: component}), nil
}
