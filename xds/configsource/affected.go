package configsource

import (
	"context"
	"strings"

	"istio.io/api/annotation"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// change is one input object's change within a debounced batch: the object
// before the batch (nil if it did not exist) and after it (nil if deleted).
type change struct {
	old, new client.Object
}

func (c change) object() client.Object {
	if c.new != nil {
		return c.new
	}
	return c.old // nil when created and deleted within the batch
}

// scope is the set of proxies a batch of changes may affect.
type scope struct {
	all        bool
	namespaces map[string]bool
	workloads  map[types.NamespacedName]bool
	selectors  []nsSelector
}

// nsSelector matches the workloads of a namespace by label.
type nsSelector struct {
	namespace string
	selector  labels.Selector
}

func newScope() *scope {
	return &scope{namespaces: map[string]bool{}, workloads: map[types.NamespacedName]bool{}}
}

func (s *scope) empty() bool {
	return !s.all && len(s.namespaces) == 0 && len(s.workloads) == 0 && len(s.selectors) == 0
}

// includes says whether the workload key, whose labels are given lazily
// (nil: unknown), is in scope.
func (s *scope) includes(key types.NamespacedName, workloadLabels func() map[string]string) bool {
	if s.all || s.namespaces[key.Namespace] || s.workloads[key] {
		return true
	}
	var l map[string]string
	for _, sel := range s.selectors {
		if sel.namespace != key.Namespace {
			continue
		}
		if l == nil {
			if l = workloadLabels(); l == nil {
				return true // labels unknown: correct rather than precise
			}
		}
		if sel.selector.Matches(labels.Set(l)) {
			return true
		}
	}
	return false
}

// exports reads what the affected-workload rule needs from the cache.
type exports interface {
	// serviceExportTo is the exportTo of Service namespace/name; ok is false
	// when it does not exist.
	serviceExportTo(ctx context.Context, namespace, name string) (exportTo []string, ok bool)
	// namespaceExportTo is the exportTo of every Service and ServiceEntry of
	// the namespace.
	namespaceExportTo(ctx context.Context, namespace string) [][]string
}

// addVisibility adds the namespaces an object of namespace ns with exportTo
// is visible from: every namespace for none or "*", ns for ".", none for
// "~", else the namespaces named.
func (s *scope) addVisibility(ns string, exportTo []string) {
	if len(exportTo) == 0 {
		s.all = true
		return
	}
	for _, e := range exportTo {
		switch e = strings.TrimSpace(e); e {
		case "*":
			s.all = true
		case ".":
			s.namespaces[ns] = true
		case "~", "":
		default:
			s.namespaces[e] = true
		}
	}
}

// serviceExportTo is a Service's networking.istio.io/exportTo annotation.
func serviceExportTo(svc *corev1.Service) []string {
	v, ok := svc.Annotations[annotation.NetworkingExportTo.Name]
	if !ok {
		return nil
	}
	return strings.Split(v, ",")
}

// Affected adds to s the proxies a change may affect. The rule (correct
// first, then precise):
//
//   - a Sidecar of the root namespace: every proxy; a Sidecar without
//     workloadSelector: every proxy of its namespace; with one: the proxies
//     of its namespace its old or new selector matches;
//   - a Service or ServiceEntry: the proxies of every namespace it is (or
//     was) exported to (Service annotation networking.istio.io/exportTo,
//     ServiceEntry spec.exportTo; none means every namespace);
//   - an EndpointSlice: as its Service (its own namespace when the Service
//     is gone);
//   - a WorkloadEntry or Pod: as every Service and ServiceEntry of its
//     namespace (those are what may select it or list it as an endpoint),
//     and its own namespace;
//   - a PeerAuthentication, AuthorizationPolicy or RequestAuthentication:
//     every proxy in the root namespace's case, else the proxies of its
//     namespace;
//   - a WorkloadAutoRegistration: that workload;
//   - anything else: every proxy.
func (s *scope) affected(ctx context.Context, c change, rootNamespace string, ex exports) {
	obj := c.object()
	if obj == nil {
		return // created and deleted within the batch
	}
	ns := obj.GetNamespace()
	switch obj.(type) {
	case *istionetworkingv1.Sidecar:
		if ns == rootNamespace {
			s.all = true
			return
		}
		for _, o := range []client.Object{c.old, c.new} {
			sc, ok := o.(*istionetworkingv1.Sidecar)
			if !ok || sc == nil {
				continue
			}
			sel := sc.Spec.GetWorkloadSelector().GetLabels()
			if len(sel) == 0 {
				s.namespaces[ns] = true
				continue
			}
			s.selectors = append(s.selectors, nsSelector{namespace: ns, selector: labels.SelectorFromSet(sel)})
		}
	case *corev1.Service:
		for _, o := range []client.Object{c.old, c.new} {
			if svc, ok := o.(*corev1.Service); ok && svc != nil {
				s.addVisibility(ns, serviceExportTo(svc))
			}
		}
	case *istionetworkingv1.ServiceEntry:
		for _, o := range []client.Object{c.old, c.new} {
			if se, ok := o.(*istionetworkingv1.ServiceEntry); ok && se != nil {
				s.addVisibility(ns, se.Spec.GetExportTo())
			}
		}
	case *discoveryv1.EndpointSlice:
		name := obj.GetLabels()[discoveryv1.LabelServiceName]
		exportTo, ok := ex.serviceExportTo(ctx, ns, name)
		if !ok || name == "" {
			s.namespaces[ns] = true
			return
		}
		s.addVisibility(ns, exportTo)
	case *istionetworkingv1.WorkloadEntry, *corev1.Pod:
		s.namespaces[ns] = true
		for _, e := range ex.namespaceExportTo(ctx, ns) {
			s.addVisibility(ns, e)
		}
	case *runtimev1alpha1.WorkloadAutoRegistration:
		s.workloads[types.NamespacedName{Namespace: ns, Name: obj.GetName()}] = true
	case *istiosecurityv1.PeerAuthentication, *istiosecurityv1.AuthorizationPolicy, *istiosecurityv1.RequestAuthentication:
		if ns == rootNamespace {
			s.all = true
			return
		}
		s.namespaces[ns] = true
	default:
		// An input kind this rule does not know: be correct.
		s.all = true
	}
}

// cacheExports reads exports from the informer cache.
type cacheExports struct{ r client.Reader }

func (c cacheExports) serviceExportTo(ctx context.Context, namespace, name string) ([]string, bool) {
	svc := &corev1.Service{}
	if err := c.r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, svc); err != nil {
		return nil, false
	}
	return serviceExportTo(svc), true
}

func (c cacheExports) namespaceExportTo(ctx context.Context, namespace string) [][]string {
	var out [][]string
	svcs := &corev1.ServiceList{}
	if err := c.r.List(ctx, svcs, client.InNamespace(namespace)); err != nil {
		return [][]string{nil} // unknown: every namespace
	}
	for i := range svcs.Items {
		out = append(out, serviceExportTo(&svcs.Items[i]))
	}
	ses := &istionetworkingv1.ServiceEntryList{}
	if err := c.r.List(ctx, ses, client.InNamespace(namespace)); err != nil {
		return [][]string{nil}
	}
	for _, se := range ses.Items {
		out = append(out, se.Spec.GetExportTo())
	}
	return out
}
