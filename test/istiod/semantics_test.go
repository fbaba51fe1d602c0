package istiod

import (
	"maps"
	"strings"
	"testing"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
)

// The objects of Istio's VM documentation, verbatim but for the namespace
// (smm-demo, ns1), which each test replaces with its own.
const (
	// analyticsService selects the VMs of fixtures.AnalyticsGroup.
	analyticsService = `
apiVersion: v1
kind: Service
metadata:
  name: analytics
  namespace: smm-demo
spec:
  ports:
  - name: http
    port: 8080
    protocol: TCP
    targetPort: 8080
  selector:
    app: analytics
  sessionAffinity: None
  type: ClusterIP
`
	// svc1 selects workloads labelled app=foo with a workloadSelector.
	svc1ServiceEntry = `
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: svc1
  namespace: ns1
spec:
  hosts:
  - svc1.internal.com
  ports:
  - number: 80
    name: http
    protocol: HTTP
  resolution: STATIC
  workloadSelector:
    labels:
      app: foo
`
	// fooGroup gives its VMs the labels of the documentation's vm1 entry
	// (app: foo, class: vm).
	fooGroup = `
apiVersion: networking.istio.io/v1alpha3
kind: WorkloadGroup
metadata:
  name: foo
  namespace: ns1
spec:
  template:
    labels:
      app: foo
      class: vm
    serviceAccount: default
`
)

// world creates a namespace with its default service account, the
// WorkloadGroup of groupDoc and the object of doc (a Service or a
// ServiceEntry), and returns the namespace and the group.
func world(t *testing.T, groupDoc, doc string, obj client.Object) (string, *istionetworkingv1.WorkloadGroup) {
	t.Helper()
	ns := env.Namespace(t)
	defaultServiceAccount(t, ns)
	wg := &istionetworkingv1.WorkloadGroup{}
	createDoc(t, groupDoc, ns, wg)
	createDoc(t, doc, ns, obj)
	return ns, wg
}

// createDoc decodes a YAML document into obj, puts it in namespace ns and
// creates it.
func createDoc(t *testing.T, doc, ns string, obj client.Object) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
		t.Fatal(err)
	}
	obj.SetNamespace(ns)
	// The typed client sends the Go type's version (v1 for Istio's).
	obj.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
	if err := env.Client.Create(t.Context(), obj); err != nil {
		t.Fatalf("create %s: %v", obj.GetName(), err)
	}
}

// defaultServiceAccount creates ns's default service account, which the
// documentation's groups name, when no controller has.
func defaultServiceAccount(t *testing.T, ns string) {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
	if err := env.Client.Create(t.Context(), sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// A WorkloadGroup whose labels are under spec.metadata only (Istio's VM
// documentation): its VMs' entries carry them, and the analytics Service,
// as istiod serves it to a pod, has the VM as its endpoint.
func TestMetadataLabelsSelectTheVMForAService(t *testing.T) {
	ns, wg := world(t, fixtures.AnalyticsGroup, analyticsService, &corev1.Service{})
	ep := startEndpoint(t, ns)
	vm := register(t, wg, 31)
	vm.connect(t, ep).reportHealth(t, true) // the group has a probe: routed once it passes

	want := map[string]string{
		"app": "analytics", "version": "v1", registry.LabelHostname: "ip-10-0-0-31", registry.LabelNetwork: "vm-network-1",
		registry.LabelCanonicalName: "analytics", registry.LabelCanonicalRevision: "v1",
	}
	we, err := getEntry(t, vm.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(we.Labels, want) || !maps.Equal(we.Spec.Labels, want) {
		t.Errorf("WorkloadEntry labels %v, spec labels %v; want %v", we.Labels, we.Spec.Labels, want)
	}
	pod := startPodProxy(t, ns, "analytics", 8080)
	pod.waitFor(t, "the VM as an endpoint of analytics", func(m map[string]vmEndpoint) bool { e, ok := m[vm.IP]; return ok && e.healthy })
}

// A ServiceEntry selecting workloads with a workloadSelector (Istio's
// WorkloadEntry introduction) has a VM of a group with those labels as its
// endpoint.
func TestServiceEntryWorkloadSelectorSelectsTheVM(t *testing.T) {
	ns, wg := world(t, fooGroup, svc1ServiceEntry, &istionetworkingv1.ServiceEntry{})
	ep := startEndpoint(t, ns)
	vm := register(t, wg, 32)
	vm.connect(t, ep)

	pod := startPodProxyFor(t, ns, "outbound|80||svc1.internal.com")
	pod.waitFor(t, "the VM as an endpoint of svc1.internal.com", func(m map[string]vmEndpoint) bool { e, ok := m[vm.IP]; return ok && e.healthy })
}

// One Service selects a pod and a VM: a pod's proxy gets both as its
// endpoints, each with its own locality (the pod's from its node's
// topology labels, the VM's from its EC2 zone).
func TestOneServiceSelectsAPodAndAVM(t *testing.T) {
	ns, wg := world(t, fixtures.AnalyticsGroup, analyticsService, &corev1.Service{})

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-" + ns, Labels: map[string]string{
		corev1.LabelTopologyRegion: "eu-west-1", corev1.LabelTopologyZone: "eu-west-1c",
	}}}
	if err := env.Client.Create(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(t.Context(), node) })
	podIP := "10.244.3.17"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "analytics-v2-0", Namespace: ns, Labels: map[string]string{"app": "analytics", "version": "v2"}}}
	pod.Spec.NodeName = node.Name
	pod.Spec.Containers = []corev1.Container{{Name: "analytics", Image: "analytics"}}
	if err := env.Client.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := env.Client.Status().Update(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "analytics-pods", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "analytics"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{podIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To(node.Name), Zone: ptr.To("eu-west-1c"),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: pod.Name, Namespace: ns},
		}},
	}
	if err := env.Client.Create(t.Context(), slice); err != nil {
		t.Fatal(err)
	}

	ep := startEndpoint(t, ns)
	vm := register(t, wg, 33)
	vm.connect(t, ep).reportHealth(t, true)

	viewer := startPodProxy(t, ns, "analytics", 8080)
	got := viewer.waitFor(t, "the pod and the VM as endpoints of analytics", func(m map[string]vmEndpoint) bool {
		p, okPod := m[podIP]
		v, okVM := m[vm.IP]
		return okPod && okVM && p.healthy && v.healthy
	})
	if l := got[vm.IP].locality; l != "us-east-2/us-east-2b" {
		t.Errorf("VM endpoint locality %q, want us-east-2/us-east-2b (its EC2 zone)", l)
	}
	if l := got[podIP].locality; !strings.HasPrefix(l, "eu-west-1/eu-west-1c") {
		t.Errorf("pod endpoint locality %q, want eu-west-1/eu-west-1c (its node's)", l)
	}
}
