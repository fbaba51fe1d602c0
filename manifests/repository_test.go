package manifests

import (
	"bufio"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
)

// checkGatewayPorts checks vmgateway against the configuration the
// endpoint runs: onboarding on 15443, the sidecars' discovery address
// port on the xDS listener and, with the local repository on, 443 on the
// container port https-repo that listen.repository names (where
// docs/vm-install.md fetches https://<host>/install/...); without it, no
// 443 at all (never the gRPC port, where curl gets HTTP 415).
func checkGatewayPorts(t *testing.T, objs []*unstructured.Unstructured, cfg *config.Configuration) {
	t.Helper()
	var gw corev1.Service
	if err := into(mustFind(t, objs, "Service", "vmgateway"), &gw); err != nil {
		t.Fatal(err)
	}
	got := map[int32]string{}
	for _, p := range gw.Spec.Ports {
		got[p.Port] = p.TargetPort.StrVal
	}
	want := map[int32]string{15443: "grpc-onboard", port(t, cfg.Mesh.DiscoveryAddress): "grpc-xds"}
	if cfg.LocalRepository != nil {
		want[443] = "https-repo"
	}
	for p, target := range want {
		if got[p] != target {
			t.Errorf("vmgateway port %d -> %q, want %q", p, got[p], target)
		}
	}
	if target, ok := got[443]; ok && cfg.LocalRepository == nil {
		t.Errorf("vmgateway port 443 -> %q, but the local repository is off: nothing serves https://<host>/install/", target)
	}
	c := endpointContainer(t, objs)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	repoPort, named := ports["https-repo"]
	switch {
	case cfg.LocalRepository != nil && repoPort != port(t, cfg.Listen.Repository):
		t.Errorf("container port https-repo = %d, the repository listens on %s", repoPort, cfg.Listen.Repository)
	case cfg.LocalRepository == nil && named:
		t.Errorf("container port https-repo %d, but the local repository is off", repoPort)
	}
}

// endpointContainer is the onboarding-endpoint Deployment's container.
func endpointContainer(t *testing.T, objs []*unstructured.Unstructured) corev1.Container {
	t.Helper()
	dep := endpointDeployment(t, objs)
	if len(dep.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(dep.Spec.Template.Spec.Containers))
	}
	return dep.Spec.Template.Spec.Containers[0]
}

func endpointDeployment(t *testing.T, objs []*unstructured.Unstructured) appsv1.Deployment {
	t.Helper()
	var dep appsv1.Deployment
	if err := into(mustFind(t, objs, "Deployment", "onboarding-endpoint"), &dep); err != nil {
		t.Fatal(err)
	}
	return dep
}

// readmeHelmValues are the --set values of the README's `helm install`
// command, as a values map: what a new user installs.
func readmeHelmValues(t *testing.T) map[string]any {
	t.Helper()
	f, err := os.Open("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	set := regexp.MustCompile(`--set ([^=\s]+)=(\S+)`)
	vals := map[string]any{}
	found, cont := false, false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		if !cont && !strings.HasPrefix(line, "helm install embark ") {
			continue
		}
		found = true
		for _, m := range set.FindAllStringSubmatch(line, -1) {
			setValue(t, vals, m[1], m[2])
		}
		if cont = strings.HasSuffix(strings.TrimSpace(line), `\`); !cont {
			break
		}
	}
	if !found {
		t.Fatal("README.md has no `helm install embark` command")
	}
	return vals
}

// setValue sets a Helm --set path (a.b, a[0]) to a string, or a boolean
// for true and false, as Helm does.
func setValue(t *testing.T, vals map[string]any, key, value string) {
	t.Helper()
	var v any = value
	if value == "true" || value == "false" {
		v = value == "true"
	}
	parts := strings.Split(key, ".")
	m := vals
	for i, p := range parts {
		name, idx, isList := strings.Cut(p, "[")
		last := i == len(parts)-1
		switch {
		case isList && last && idx == "0]":
			m[name] = []any{v}
		case isList:
			t.Fatalf("README --set %s: only [0] of a last key is supported", key)
		case last:
			m[name] = v
		default:
			next, _ := m[name].(map[string]any)
			if next == nil {
				next = map[string]any{}
				m[name] = next
			}
			m = next
		}
	}
}

// The chart installed the way the README says serves the local
// repository on vmgateway's 443 (the container port listen.repository
// names, which the NetworkPolicy admits), with apt and yum metadata
// signed by the key of the Secret the README creates, mounted where
// localRepository.signingKeyFile points; the API server accepts the
// objects.
func TestREADMEInstallServesTheRepositoryOn443(t *testing.T) {
	vals := readmeHelmValues(t)
	out, objs := renderChart(t, vals)
	cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", "onboarding-endpoint"))
	if cfg.LocalRepository == nil {
		t.Fatalf("the README's install (values %v) has no local repository: docs/vm-install.md installs from it", vals)
	}
	checkGatewayPorts(t, objs, cfg)
	if cfg.LocalRepository.SigningKeyFile == "" {
		t.Fatal("the README's install signs no apt/yum metadata: apt-get cannot use the repository")
	}
	wantSecret, _ := vals["localRepository"].(map[string]any)["signingKey"].(map[string]any)["secretName"].(string)
	checkMountedSecretKey(t, endpointDeployment(t, objs).Spec.Template.Spec, cfg.LocalRepository.SigningKeyFile, wantSecret)

	np := mustFind(t, objs, "NetworkPolicy", "onboarding-endpoint")
	rules, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	admitted := false
	for _, r := range rules {
		ps, _, _ := unstructured.NestedSlice(r.(map[string]any), "ports")
		for _, p := range ps {
			admitted = admitted || p.(map[string]any)["port"] == "https-repo"
		}
	}
	if !admitted {
		t.Error("the NetworkPolicy does not admit the repository port https-repo")
	}

	createBookinfo(t)
	got, err := env.Kubectl(t.Context(), out, "apply", "--server-side", "--force-conflicts", "--field-manager=embark-test",
		"--dry-run=server", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	appliedAll(t, got, objs)
}

// checkMountedSecretKey checks that file is key of Secret secretName,
// mounted read-only in the container, readable by the Pod's group only.
func checkMountedSecretKey(t *testing.T, pod corev1.PodSpec, file, secretName string) {
	t.Helper()
	c := pod.Containers[0]
	dir, key := path.Split(file)
	i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return path.Clean(m.MountPath) == path.Clean(dir) })
	if i < 0 {
		t.Fatalf("no volume is mounted at %s (the signing key file %s)", dir, file)
	}
	m := c.VolumeMounts[i]
	if !m.ReadOnly {
		t.Errorf("volume %s at %s is writable", m.Name, m.MountPath)
	}
	j := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
	if j < 0 || pod.Volumes[j].Secret == nil {
		t.Fatalf("volume %s is not a Secret", m.Name)
	}
	s := pod.Volumes[j].Secret
	if s.SecretName != secretName {
		t.Errorf("signing key from Secret %q, the README creates %q", s.SecretName, secretName)
	}
	if !slices.ContainsFunc(s.Items, func(k corev1.KeyToPath) bool { return k.Key == key && k.Path == key }) {
		t.Errorf("Secret volume %s items %v do not put key %s at %s", m.Name, s.Items, key, file)
	}
	if s.DefaultMode == nil || *s.DefaultMode != 0o440 {
		t.Errorf("signing key mode %v, want 0440 (the Pod's group reads it, nobody else)", s.DefaultMode)
	}
}

// repositoryWithSources turns the local repository on with its signing key
// and Istio's istio-sidecar packages from a PersistentVolumeClaim.
var repositoryWithSources = map[string]any{"localRepository": map[string]any{
	"enabled":    true,
	"signingKey": map[string]any{"secretName": "onboarding-endpoint-repository-key"},
	"extraSources": []any{map[string]any{"name": "istio-sidecar",
		"volume": map[string]any{"persistentVolumeClaim": map[string]any{"claimName": "istio-sidecar-packages", "readOnly": true}}}},
}}

// Every extra package directory the endpoint is configured with is a
// volume mounted read-only at exactly that path, and the main directory
// is the image's (no volume hides it).
func TestRepositoryExtraSourcesAreMounted(t *testing.T) {
	_, objs := renderChart(t, repositoryWithSources)
	cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", "onboarding-endpoint"))
	if cfg.LocalRepository == nil || len(cfg.LocalRepository.ExtraDirectories) != 1 {
		t.Fatalf("localRepository %+v: want one extra directory", cfg.LocalRepository)
	}
	pod := endpointDeployment(t, objs).Spec.Template.Spec
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range pod.Containers[0].VolumeMounts {
		mounts[path.Clean(m.MountPath)] = m
	}
	for _, d := range cfg.LocalRepository.ExtraDirectories {
		m, ok := mounts[path.Clean(d)]
		if !ok {
			t.Errorf("extra directory %s: no volume is mounted there", d)
			continue
		}
		if !m.ReadOnly {
			t.Errorf("extra directory %s: volume %s is writable", d, m.Name)
		}
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || pod.Volumes[i].PersistentVolumeClaim == nil || pod.Volumes[i].PersistentVolumeClaim.ClaimName != "istio-sidecar-packages" {
			t.Errorf("extra directory %s: volume %s is not the claim istio-sidecar-packages", d, m.Name)
		}
	}
	for dir := path.Clean(cfg.LocalRepository.Directory); dir != "/"; dir = path.Dir(dir) {
		if m, ok := mounts[dir]; ok {
			t.Errorf("volume %s mounted at %s hides the image's packages in %s", m.Name, dir, cfg.LocalRepository.Directory)
		}
	}
}
