package configsource

import (
	"maps"

	"google.golang.org/protobuf/proto"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/translate"
)

// relevant says whether an update may change a translation: a new
// generation (spec) or labels, and for the kinds translation reads more of,
// what it reads. Status and annotation writes of the registry (connection
// state on registrations and WorkloadEntries) are not, so a fleet
// connecting does not recompute everyone's configuration.
func relevant(old, updated client.Object) bool {
	if old.GetGeneration() != updated.GetGeneration() || !maps.Equal(old.GetLabels(), updated.GetLabels()) {
		return true
	}
	switch o := old.(type) {
	case *istionetworkingv1.WorkloadEntry:
		n, ok := updated.(*istionetworkingv1.WorkloadEntry)
		return !ok || o.Annotations[translate.HealthChecksAnnotation] != n.Annotations[translate.HealthChecksAnnotation] ||
			!proto.Equal(&o.Status, &n.Status)
	case *corev1.Service:
		n, ok := updated.(*corev1.Service)
		return !ok || !equality.Semantic.DeepEqual(o.Spec, n.Spec) || !equality.Semantic.DeepEqual(serviceExportTo(o), serviceExportTo(n))
	case *corev1.Pod:
		// Translation reads a pod's service account, IP and readiness (and
		// its labels, compared above); kubelet's other status writes are
		// not relevant.
		n, ok := updated.(*corev1.Pod)
		return !ok || o.Spec.ServiceAccountName != n.Spec.ServiceAccountName || o.Status.PodIP != n.Status.PodIP ||
			o.Status.Phase != n.Status.Phase || podReady(o) != podReady(n) || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	case *discoveryv1.EndpointSlice:
		n, ok := updated.(*discoveryv1.EndpointSlice)
		return !ok || o.AddressType != n.AddressType || !equality.Semantic.DeepEqual(o.Endpoints, n.Endpoints) || !equality.Semantic.DeepEqual(o.Ports, n.Ports)
	}
	return false
}

// podReady is the pod's Ready condition.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TrimPod is an informer transform (cache.ByObject.Transform) keeping only
// what translation and relevant read of a Pod: name, namespace, labels,
// versions, service account, IP, phase and conditions. It keeps a cluster's
// pod cache small.
func TrimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: kept as is
	}
	return &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels,
			ResourceVersion: p.ResourceVersion, Generation: p.Generation,
			CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec:   corev1.PodSpec{ServiceAccountName: p.Spec.ServiceAccountName},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, Conditions: p.Status.Conditions},
	}, nil
}
