package manifests

import (
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/test/testenv"
)

// istioctlGenerate renders the IstioOperator overlay with the real
// istioctl (`istioctl manifest generate -f`).
func istioctlGenerate(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	assets, err := testenv.AssetsDir("")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), filepath.Join(assets, "istioctl"), "manifest", "generate", "-f", "istio-operator/istio-operator.yaml")
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("istioctl manifest generate: %v: %s", err, msg)
	}
	objs, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// podContainer returns the Deployment's Pod spec and its container named name.
func podContainer(t *testing.T, objs []*unstructured.Unstructured, deployment, name string) (corev1.PodSpec, corev1.Container) {
	t.Helper()
	var d appsv1.Deployment
	if err := into(mustFind(t, objs, "Deployment", deployment), &d); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("Deployment %s has no container %s", deployment, name)
	}
	return d.Spec.Template.Spec, d.Spec.Template.Spec.Containers[i]
}

// What the IstioOperator overlay deploys beside istiod is what the chart
// deploys, but for what running inside istiod's Pod changes: the ports
// (istiod holds 15012 and 15014), the user (istiod's), and istiod's
// address (the discovery container of the same Pod, so of the same
// revision). The RBAC, CRDs and Services come from the base, which
// TestChartMatchesKustomizeBase compares with the chart.
func TestIstioOperatorOverlayMatchesChart(t *testing.T) {
	_, chart := renderChart(t, nil)
	_, kobjs := build(t, "istio-operator")
	opPod, op := podContainer(t, istioctlGenerate(t), "istiod", "onboarding-endpoint")
	chPod, ch := podContainer(t, chart, "onboarding-endpoint", "onboarding-endpoint")

	chCfg := endpointConfig(t, mustFind(t, chart, "ConfigMap", "onboarding-endpoint"))
	opCfg := endpointConfig(t, mustFind(t, kobjs, "ConfigMap", "onboarding-endpoint-istiod"))
	if opCfg.Istiod.Address != "localhost:15012" {
		t.Errorf("the overlay's endpoint reaches istiod at %q, want the discovery container beside it (localhost:15012)", opCfg.Istiod.Address)
	}
	// Normalise what differs by design, then compare the rest.
	opCfg.Listen, opCfg.Istiod.Address = chCfg.Listen, chCfg.Istiod.Address
	if !reflect.DeepEqual(opCfg, chCfg) {
		t.Errorf("configuration differs:\noverlay %+v\nchart   %+v", opCfg, chCfg)
	}

	if !reflect.DeepEqual(op.Resources, ch.Resources) {
		t.Errorf("resources: overlay %v, chart %v", op.Resources, ch.Resources)
	}
	if op.Image != ch.Image {
		t.Errorf("image: overlay %s, chart %s", op.Image, ch.Image)
	}
	for name, p := range map[string][2]*corev1.Probe{"readiness": {op.ReadinessProbe, ch.ReadinessProbe}, "liveness": {op.LivenessProbe, ch.LivenessProbe}} {
		if p[0] == nil || p[1] == nil || p[0].HTTPGet == nil || p[1].HTTPGet == nil || p[0].HTTPGet.Path != p[1].HTTPGet.Path {
			t.Errorf("%s probe: overlay %v, chart %v", name, p[0], p[1])
		}
	}
	opSec, chSec := op.SecurityContext.DeepCopy(), ch.SecurityContext.DeepCopy()
	opSec.RunAsUser, opSec.RunAsGroup, chSec.RunAsUser, chSec.RunAsGroup = nil, nil, nil, nil
	if !reflect.DeepEqual(opSec, chSec) {
		t.Errorf("securityContext (users aside): overlay %v, chart %v", opSec, chSec)
	}
	if !slices.Contains(op.Args, "--config=/etc/onboarding-endpoint/config.yaml") || !slices.Contains(ch.Args, "--config=/etc/onboarding-endpoint/config.yaml") {
		t.Errorf("args: overlay %v, chart %v", op.Args, ch.Args)
	}
	// Both mount istiod's root where the configuration reads it.
	for name, pc := range map[string]struct {
		pod corev1.PodSpec
		c   corev1.Container
	}{"overlay": {opPod, op}, "chart": {chPod, ch}} {
		m := slices.IndexFunc(pc.c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/etc/istio-root" })
		if m < 0 {
			t.Errorf("%s: nothing mounted at /etc/istio-root (istiod.rootCertFile %s)", name, chCfg.Istiod.RootCertFile)
			continue
		}
		v := slices.IndexFunc(pc.pod.Volumes, func(v corev1.Volume) bool { return v.Name == pc.c.VolumeMounts[m].Name })
		if v < 0 || pc.pod.Volumes[v].ConfigMap == nil || pc.pod.Volumes[v].ConfigMap.Name != "istio-ca-root-cert" {
			t.Errorf("%s: /etc/istio-root is not the istio-ca-root-cert ConfigMap", name)
		}
	}
	if !strings.HasPrefix(chCfg.Istiod.RootCertFile, "/etc/istio-root/") {
		t.Errorf("istiod.rootCertFile %s is not in the mounted root", chCfg.Istiod.RootCertFile)
	}
}

// The IstioOperator overlay renders with the real istioctl into an istiod
// Deployment that runs the endpoint beside discovery on ports of its own,
// with the configuration the istio-operator kustomization ships, and the
// API server accepts the result.
func TestIstioOperatorOverlayRunsTheEndpointBesideIstiod(t *testing.T) {
	objs := istioctlGenerate(t)
	u := mustFind(t, objs, "Deployment", "istiod")
	var istiod appsv1.Deployment
	if err := into(u, &istiod); err != nil {
		t.Fatal(err)
	}
	pod := istiod.Spec.Template.Spec
	i := slices.IndexFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == "onboarding-endpoint" })
	if i < 0 {
		t.Fatalf("istiod runs no onboarding-endpoint container: %d containers", len(pod.Containers))
	}
	embark := pod.Containers[i]
	if !slices.ContainsFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == "discovery" }) {
		t.Error("the overlay replaced istiod's discovery container")
	}

	// Its configuration is the istio-operator kustomization's, mounted.
	_, kobjs := build(t, "istio-operator")
	cmName := "onboarding-endpoint-istiod"
	cfg := endpointConfig(t, mustFind(t, kobjs, "ConfigMap", cmName))
	vol := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.ConfigMap != nil && v.ConfigMap.Name == cmName })
	if vol < 0 {
		t.Fatalf("istiod mounts no ConfigMap %s", cmName)
	}
	if !slices.ContainsFunc(embark.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == pod.Volumes[vol].Name && m.MountPath == "/etc/onboarding-endpoint"
	}) || !slices.Contains(embark.Args, "--config=/etc/onboarding-endpoint/config.yaml") {
		t.Errorf("the configuration is not mounted where --config reads it: %v %v", embark.VolumeMounts, embark.Args)
	}

	// No port of the endpoint (listeners and the xDS debug listener) is one
	// istiod's containers use; the listeners are the container's ports.
	istiodPorts := map[int32]bool{15010: true, 15012: true, 15014: true, 15017: true, 8080: true}
	for _, c := range pod.Containers {
		if c.Name == embark.Name {
			continue
		}
		for _, p := range c.Ports {
			istiodPorts[p.ContainerPort] = true
		}
	}
	declared := map[int32]bool{}
	for _, p := range embark.Ports {
		declared[p.ContainerPort] = true
	}
	for _, addr := range []string{cfg.Listen.Onboarding, cfg.Listen.XDS, cfg.Listen.Metrics} {
		p := port(t, addr)
		if istiodPorts[p] {
			t.Errorf("the endpoint listens on %d, which istiod uses", p)
		}
		if !declared[p] {
			t.Errorf("the endpoint listens on %d, not a declared container port", p)
		}
	}
	debug := ""
	for _, a := range embark.Args {
		if v, ok := strings.CutPrefix(a, "--debug-xds="); ok {
			debug = v
		}
	}
	if debug == "" || istiodPorts[port(t, debug)] {
		t.Errorf("the xDS debug listener %q collides with istiod (15010) or is unset", debug)
	}
	for name, p := range map[string]*corev1.Probe{"readiness": embark.ReadinessProbe, "liveness": embark.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.IntVal != port(t, cfg.Listen.Metrics) {
			t.Errorf("%s probe %+v does not reach the endpoint's health port", name, p)
		}
	}

	// vmgateway and the metrics Service select istiod's Pods and reach the
	// endpoint's ports.
	podLabels := istiod.Spec.Template.Labels
	for _, name := range []string{"vmgateway", "onboarding-endpoint-metrics"} {
		var svc corev1.Service
		if err := into(mustFind(t, kobjs, "Service", name), &svc); err != nil {
			t.Fatal(err)
		}
		if !selects(svc.Spec.Selector, podLabels) {
			t.Errorf("Service %s selector %v does not select istiod's pods %v", name, svc.Spec.Selector, podLabels)
		}
		for _, p := range svc.Spec.Ports {
			if !declared[p.TargetPort.IntVal] {
				t.Errorf("Service %s port %d targets %s, not an endpoint port", name, p.Port, p.TargetPort.String())
			}
		}
	}
	// vmgateway is an internal load balancer, as the base's; no
	// NetworkPolicy of the base's (made for the endpoint's own Pods) lands
	// on istiod's.
	if ann := mustFind(t, kobjs, "Service", "vmgateway").GetAnnotations(); ann["service.beta.kubernetes.io/aws-load-balancer-internal"] != "true" {
		t.Errorf("vmgateway annotations %v: not an internal load balancer", ann)
	}
	for _, o := range kobjs {
		if o.GetKind() == "NetworkPolicy" {
			t.Errorf("the overlay ships NetworkPolicy %s, which would govern istiod's Pods", o.GetName())
		}
	}
	// The RBAC is bound to istiod's ServiceAccount.
	crb := mustFind(t, kobjs, "ClusterRoleBinding", "embark-onboarding-endpoint")
	subjects, _ := crb.Object["subjects"].([]any)
	if len(subjects) != 1 || subjects[0].(map[string]any)["name"] != pod.ServiceAccountName {
		t.Errorf("ClusterRoleBinding subjects %v, istiod runs as %q", subjects, pod.ServiceAccountName)
	}

	// The rendered Deployment is valid for the API server.
	data, err := sigsyaml.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := env.Kubectl(t.Context(), data, "apply", "--server-side", "--dry-run=server", "--field-manager=embark-test", "-f", "-"); err != nil {
		t.Errorf("server-side dry run of the rendered istiod Deployment: %v", err)
	} else if !strings.Contains(got, "deployment.apps/istiod") {
		t.Errorf("apply output %q", got)
	}
}
