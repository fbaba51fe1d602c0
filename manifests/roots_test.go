package manifests

import (
	"path"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// rootsSource is where the file of mesh.rootCertFile comes from in a Pod:
// the Secret or ConfigMap and its key, mounted at the file's path.
type rootsSource struct {
	kind, name, key string
}

// meshRootsSource follows mesh.rootCertFile of a configuration to the
// volume mounted at its directory and the key projected as its file.
func meshRootsSource(t *testing.T, pod corev1.PodSpec, c corev1.Container, file string) rootsSource {
	t.Helper()
	if file == "" {
		t.Fatal("mesh.rootCertFile is empty: the bootstrap carries no roots and the agent refuses it")
	}
	dir, base := path.Split(file)
	m := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.TrimSuffix(m.MountPath, "/")+"/" == dir })
	if m < 0 {
		t.Fatalf("mesh.rootCertFile %s: no volume mounted at %s", file, dir)
	}
	v := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[m].Name })
	if v < 0 {
		t.Fatalf("mesh.rootCertFile %s: the Pod has no volume %s", file, c.VolumeMounts[m].Name)
	}
	vol := pod.Volumes[v]
	var src rootsSource
	var items []corev1.KeyToPath
	switch {
	case vol.Secret != nil:
		src, items = rootsSource{kind: "Secret", name: vol.Secret.SecretName}, vol.Secret.Items
	case vol.ConfigMap != nil:
		src, items = rootsSource{kind: "ConfigMap", name: vol.ConfigMap.Name}, vol.ConfigMap.Items
	default:
		t.Fatalf("mesh.rootCertFile %s: volume %s is neither a Secret nor a ConfigMap", file, vol.Name)
	}
	src.key = base // without items, each key is a file of its name
	if i := slices.IndexFunc(items, func(k corev1.KeyToPath) bool { return k.Path == base }); i >= 0 {
		src.key = items[i].Key
	} else if len(items) > 0 {
		t.Fatalf("mesh.rootCertFile %s: volume %s projects no %s", file, vol.Name, base)
	}
	return src
}

// A default install sends VMs their roots: in the chart, the base and the
// IstioOperator overlay, mesh.rootCertFile is the ca.crt of the serving
// Secret (endpoint.secretName), mounted into the endpoint's container; the
// chart's mesh.rootCerts points it at a ConfigMap key instead.
func TestDefaultInstallSendsVMsTheServingCA(t *testing.T) {
	_, chart := renderChart(t, nil)
	_, base := build(t, "base")
	_, operator := build(t, "istio-operator")
	_, fromConfigMap := renderChart(t, map[string]any{"mesh": map[string]any{"rootCerts": map[string]any{"configMapName": "vm-roots", "key": "roots.pem"}}})
	tests := []struct {
		name              string
		objs              []*unstructured.Unstructured
		deployment        string
		podObjs           func() []*unstructured.Unstructured
		configMap         string
		want              rootsSource
		wantServingSecret bool
	}{
		{name: "chart", objs: chart, deployment: "onboarding-endpoint", configMap: "onboarding-endpoint", wantServingSecret: true},
		{name: "base", objs: base, deployment: "onboarding-endpoint", configMap: "onboarding-endpoint", wantServingSecret: true},
		{name: "istio-operator", objs: operator, deployment: "istiod", podObjs: func() []*unstructured.Unstructured { return istioctlGenerate(t) },
			configMap: "onboarding-endpoint-istiod", wantServingSecret: true},
		{name: "chart, roots from a ConfigMap", objs: fromConfigMap, deployment: "onboarding-endpoint", configMap: "onboarding-endpoint",
			want: rootsSource{kind: "ConfigMap", name: "vm-roots", key: "roots.pem"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := endpointConfig(t, mustFind(t, tc.objs, "ConfigMap", tc.configMap))
			podObjs := tc.objs
			if tc.podObjs != nil {
				podObjs = tc.podObjs()
			}
			pod, c := podContainer(t, podObjs, tc.deployment, "onboarding-endpoint")
			want := tc.want
			if tc.wantServingSecret {
				want = rootsSource{kind: "Secret", name: cfg.Endpoint.SecretName, key: "ca.crt"}
			}
			if got := meshRootsSource(t, pod, c, cfg.Mesh.RootCertFile); got != want {
				t.Errorf("mesh.rootCertFile %s is %+v, want %+v", cfg.Mesh.RootCertFile, got, want)
			}
		})
	}
}
