package configsource

import (
	"maps"

	"google.golang.org/protobuf/proto"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/translate"
)

// relevant says whether an update may change a translation: a new
// generation (spec) or labels, and for the kinds translation reads more of,
// what it reads. Status and annotation writes of the registry (connection
// state on registrations and WorkloadEntries) are not, so a fleet
// connecting does not recompute everyone's configuration.
func relevant(old, new client.Object) bool {
	if old.GetGeneration() != new.GetGeneration() || !maps.Equal(old.GetLabels(), new.GetLabels()) {
		return true
	}
	switch o := old.(type) {
	case *istionetworkingv1.WorkloadEntry:
		n, ok := new.(*istionetworkingv1.WorkloadEntry)
		return !ok || o.Annotations[translate.HealthChecksAnnotation] != n.Annotations[translate.HealthChecksAnnotation] ||
			!proto.Equal(&o.Status, &n.Status)
	case *corev1.Service:
		n, ok := new.(*corev1.Service)
		return !ok || !equality.Semantic.DeepEqual(o.Spec, n.Spec) || !equality.Semantic.DeepEqual(serviceExportTo(o), serviceExportTo(n))
	case *discoveryv1.EndpointSlice:
		n, ok := new.(*discoveryv1.EndpointSlice)
		return !ok || o.AddressType != n.AddressType || !equality.Semantic.DeepEqual(o.Endpoints, n.Endpoints) || !equality.Semantic.DeepEqual(o.Ports, n.Ports)
	}
	return false
}
