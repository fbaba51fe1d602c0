package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/internal/loop"
)

// queue is what a reconciler queues its own keys with: a loop.Loop (a
// workqueue in tests).
type queue interface {
	Add(types.NamespacedName)
	AddAfter(types.NamespacedName, time.Duration)
	Len() int
	ShutDown()
}

var _ queue = (*loop.Loop)(nil)

// newLoop returns the shared loop (internal/loop) of a lifecycle
// reconciler: keys are registrations, logged as "registration", and a
// resync queues every registration in c. Add watches, then Run it.
func newLoop(c cache.Cache, name string, reconcile loop.Func, workers int, resync time.Duration, log *slog.Logger) *loop.Loop {
	return newLoopOf(name, reconcile, workers, resync, log, func(ctx context.Context) ([]types.NamespacedName, error) {
		return registrationKeys(ctx, c)
	})
}

// newLoopOf is newLoop with a resync of what keys lists.
func newLoopOf(name string, reconcile loop.Func, workers int, resync time.Duration, log *slog.Logger, keys func(context.Context) ([]types.NamespacedName, error)) *loop.Loop {
	return loop.New(reconcile, loop.Options{
		Name: name, KeyName: "registration", Workers: workers, Resync: resync, Keys: keys, Logger: log,
	})
}

// watchRegistrations queues every registration added or updated.
func watchRegistrations(ctx context.Context, l *loop.Loop, c cache.Cache) error {
	return l.Watch(ctx, c, &runtimev1alpha1.WorkloadAutoRegistration{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { enqueueObject(l, obj) },
		UpdateFunc: func(_, obj any) { enqueueObject(l, obj) },
	})
}

// enqueueObject queues the key of an informer object.
func enqueueObject(q queue, obj any) {
	if o, ok := obj.(client.Object); ok {
		q.Add(client.ObjectKeyFromObject(o))
	}
}

// registrationKeys lists the keys of every registration in the cache.
func registrationKeys(ctx context.Context, c cache.Cache) ([]types.NamespacedName, error) {
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := c.List(ctx, list); err != nil {
		return nil, fmt.Errorf("list registrations: %w", err)
	}
	keys := make([]types.NamespacedName, len(list.Items))
	for i := range list.Items {
		keys[i] = client.ObjectKeyFromObject(&list.Items[i])
	}
	return keys, nil
}
