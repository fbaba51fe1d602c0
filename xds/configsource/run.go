package configsource

import (
	"context"
	"fmt"
	"slices"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/internal/watch"
)

// Pusher is the xDS server as Run uses it (*xds.Server satisfies it).
type Pusher interface {
	// Proxies are the connected proxies.
	Proxies() []*xds.Proxy
	// Refresh recomputes the configuration of the workloads' proxies.
	Refresh(ctx context.Context, keys ...types.NamespacedName)
}

// Watched are the objects whose changes Run watches; add their lists to the
// informer cache's sync list.
func Watched() []client.ObjectList {
	return []client.ObjectList{
		&istionetworkingv1.SidecarList{}, &corev1.ServiceList{}, &discoveryv1.EndpointSliceList{},
		&istionetworkingv1.ServiceEntryList{}, &istionetworkingv1.WorkloadEntryList{},
		&runtimev1alpha1.WorkloadAutoRegistrationList{}, &istiosecurityv1.PeerAuthenticationList{},
		&istiosecurityv1.AuthorizationPolicyList{}, &istiosecurityv1.RequestAuthenticationList{}, &corev1.PodList{},
	}
}

// MeshConfig are the objects translation reads from every namespace (the
// mesh's services and policies, not only the workloads' namespaces): an
// endpoint whose cache is scoped to its workload namespaces watches these
// cluster-wide, read-only, in standalone mode.
func MeshConfig() []client.Object {
	return slices.DeleteFunc(watched(), func(o client.Object) bool {
		_, isRegistration := o.(*runtimev1alpha1.WorkloadAutoRegistration)
		return isRegistration
	})
}

// watched are the objects whose informers Run watches.
func watched() []client.Object {
	return []client.Object{
		&istionetworkingv1.Sidecar{}, &corev1.Service{}, &discoveryv1.EndpointSlice{},
		&istionetworkingv1.ServiceEntry{}, &istionetworkingv1.WorkloadEntry{},
		&runtimev1alpha1.WorkloadAutoRegistration{}, &istiosecurityv1.PeerAuthentication{},
		&istiosecurityv1.AuthorizationPolicy{}, &istiosecurityv1.RequestAuthentication{}, &corev1.Pod{},
	}
}

// Run watches the inputs and, after each debounced batch of changes,
// recomputes the configuration of the proxies the batch affects, until ctx
// ends.
func (s *Source) Run(ctx context.Context, push Pusher) error {
	d := newDebouncer(s.opts.Debounce)
	var handlers watch.Handlers
	defer handlers.RemoveAll()
	for _, obj := range watched() {
		kind := fmt.Sprintf("%T", obj)
		// A registration is read only for its own workload's labels (from
		// the proxy, not the cache): its changes leave every scope's
		// translation as it is.
		_, isRegistration := obj.(*runtimev1alpha1.WorkloadAutoRegistration)
		indexed := isIndexed(obj)
		add := func(old, updated client.Object) {
			if !isRegistration {
				s.scopes.changed()
			}
			if indexed {
				s.endpoints.changed()
			}
			d.add(kind, old, updated, s.opts.Clock())
		}
		err := handlers.Add(ctx, s.opts.Cache, obj, toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) {
				if co, ok := o.(client.Object); ok {
					add(nil, co)
				}
			},
			UpdateFunc: func(oldObj, newObj any) {
				o, ok1 := oldObj.(client.Object)
				n, ok2 := newObj.(client.Object)
				if ok1 && ok2 && o.GetResourceVersion() != n.GetResourceVersion() && relevant(o, n) {
					add(o, n)
				}
			},
			DeleteFunc: func(o any) {
				if co := watch.Deleted(o); co != nil {
					add(co, nil)
				}
			},
		})
		if err != nil {
			return err
		}
	}
	// From here every change of the inputs is seen: translations of a
	// scope can be shared until the next one.
	s.scopes.watch(true)
	defer s.scopes.watch(false)
	s.endpoints.watch(true)
	defer s.endpoints.watch(false)

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		wait, pending := d.wait(s.opts.Clock())
		switch {
		case !pending:
			select {
			case <-ctx.Done():
				return nil
			case <-d.signal:
			}
			continue
		case wait > 0:
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return nil
			case <-timer.C:
			case <-d.signal: // the batch grew: compute the wait again
				timer.Stop() // no stale tick is received after Stop (Go 1.23 timers)
			}
			continue
		}
		changes, first := d.take()
		s.push(ctx, push, changes, first)
	}
}

// isIndexed says whether obj is of a kind endpoints.Index indexes.
func isIndexed(obj client.Object) bool {
	switch obj.(type) {
	case *discoveryv1.EndpointSlice, *corev1.Pod, *istionetworkingv1.WorkloadEntry:
		return true
	}
	return false
}

// push recomputes the proxies that changes affect.
func (s *Source) push(ctx context.Context, push Pusher, changes []change, first time.Time) {
	sc := newScope()
	ex := cacheExports{r: s.opts.Cache}
	for _, c := range changes {
		sc.affected(ctx, c, s.opts.RootNamespace, ex)
	}
	proxies := push.Proxies()
	s.prune(proxies)
	if sc.empty() {
		return
	}
	keys := affectedWorkloads(sc, proxies, s.workloadOf, s.log)
	ctx = withListed(ctx) // each namespace's selecting objects listed once per push
	push.Refresh(ctx, keys...)
	if m := s.opts.Metrics; m != nil {
		m.pushed.Add(float64(len(keys)))
		m.push.Observe(s.opts.Clock().Sub(first).Seconds())
	}
	s.log.Debug("configuration pushed", "changes", len(changes), "workloads", len(keys), "since", s.opts.Clock().Sub(first))
}

// affectedWorkloads are the workloads of proxies in scope, once each, in the
// order of proxies.
func affectedWorkloads(sc *scope, proxies []*xds.Proxy, workload func(*xds.Proxy) *workloadOf, log interface {
	Warn(string, ...any)
}) []types.NamespacedName {
	seen := map[types.NamespacedName]bool{}
	var keys []types.NamespacedName
	for _, p := range proxies {
		key := p.Workload.Key
		if seen[key] {
			continue
		}
		in := sc.includes(key, func() map[string]string {
			w := workload(p)
			if w.err != nil {
				log.Warn("workload labels unknown; recomputing its configuration anyway", "registration", key.String(), "error", w.err)
				return nil // unknown: in scope
			}
			return w.labels
		})
		if in {
			seen[key] = true
			keys = append(keys, key)
		}
	}
	return keys
}

// prune forgets the nodes that are no longer connected.
func (s *Source) prune(proxies []*xds.Proxy) {
	live := make(map[string]bool, len(proxies))
	for _, p := range proxies {
		live[p.NodeID] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.served {
		if !live[id] {
			delete(s.served, id)
		}
	}
	for id := range s.workloads {
		if !live[id] {
			delete(s.workloads, id)
		}
	}
	for id := range s.owns {
		if !live[id] {
			delete(s.owns, id)
		}
	}
}
