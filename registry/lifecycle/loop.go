package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
)

// loop is the informer and work-queue set-up the lifecycle's level-based
// reconcilers share: informers whose events queue registration keys, one
// rate-limited queue (failures retried 100ms to 1m), workers, and a periodic
// resync of every registration (or of what keys lists). Make it with
// newLoop, add watches, then run.
type loop struct {
	cache   cache.Cache
	queue   workqueue.TypedRateLimitingInterface[types.NamespacedName]
	synced  []toolscache.InformerSynced
	removes []func()
	// keys lists what a resync queues. Default: every registration.
	keys func(context.Context) ([]types.NamespacedName, error)
}

func newLoop(c cache.Cache) *loop {
	return &loop{
		cache: c,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, time.Minute)),
		keys:  func(ctx context.Context) ([]types.NamespacedName, error) { return registrationKeys(ctx, c) },
	}
}

// watch adds h to the informer of obj's type; what names the type in errors.
func (l *loop) watch(ctx context.Context, obj client.Object, what string, h toolscache.ResourceEventHandler) error {
	inf, err := l.cache.GetInformer(ctx, obj)
	if err != nil {
		return fmt.Errorf("watch %s: %w", what, err)
	}
	reg, err := inf.AddEventHandler(h)
	if err != nil {
		return fmt.Errorf("watch %s: %w", what, err)
	}
	l.synced = append(l.synced, reg.HasSynced)
	l.removes = append(l.removes, func() { _ = inf.RemoveEventHandler(reg) })
	return nil
}

// watchRegistrations queues every registration added or updated.
func (l *loop) watchRegistrations(ctx context.Context) error {
	return l.watch(ctx, &runtimev1alpha1.WorkloadAutoRegistration{}, "WorkloadAutoRegistrations", toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { enqueueObject(l.queue, obj) },
		UpdateFunc: func(_, obj any) { enqueueObject(l.queue, obj) },
	})
}

// run waits for the watches to sync, then reconciles the queued keys with
// workers workers, and queues every registration now and every resync,
// until ctx ends. It returns once the workers have stopped and the watches
// are removed.
func (l *loop) run(ctx context.Context, workers int, reconcile func(context.Context, types.NamespacedName) error, resync time.Duration, log *slog.Logger, what string) {
	defer l.close()
	if !toolscache.WaitForCacheSync(ctx.Done(), l.synced...) {
		return // ctx ended
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for registry.ProcessNext(ctx, l.queue, reconcile, log, what) {
			}
		})
	}
	resyncAll(ctx, l.keys, l.queue, resync, log)
	l.queue.ShutDown()
	wg.Wait()
}

// close removes the watches and shuts the queue down.
func (l *loop) close() {
	for _, remove := range l.removes {
		remove()
	}
	l.removes = nil
	l.queue.ShutDown()
}

// enqueueObject queues the key of an informer object.
func enqueueObject(queue workqueue.TypedInterface[types.NamespacedName], obj any) {
	if o, ok := obj.(client.Object); ok {
		queue.Add(client.ObjectKeyFromObject(o))
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

// resyncAll queues every key keys lists now and every period until ctx
// ends.
func resyncAll(ctx context.Context, keys func(context.Context) ([]types.NamespacedName, error), queue workqueue.TypedInterface[types.NamespacedName], period time.Duration, log *slog.Logger) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		all, err := keys(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Error("list for a resync", "error", err)
		}
		for _, k := range all {
			queue.Add(k)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
