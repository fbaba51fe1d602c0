//go:build install

package install

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
)

// ClusterOptions configures StartCluster.
type ClusterOptions struct {
	// ValuesFromREADME renders the chart with the --set values of
	// README.md's `helm install` command (its release, chart and
	// namespace always come from there).
	ValuesFromREADME bool
	// ExtraValues are more values files (-f), after the README's values.
	ExtraValues []string
	// Values, when set, returns more values files once the control plane
	// runs (e.g. ones naming its service-account issuer), after
	// ExtraValues.
	Values func(t *testing.T, env *testenv.Env) []string
	// GatewayIP is the vmgateway Service's load balancer address: the
	// host's end of the VM network (Network.HostIP). The forwarders of the
	// Service's ports listen there. Required.
	GatewayIP netip.Addr
	// ImageDir is `make image`'s output (EMBARK_IMAGE_DIR); PackagesDir
	// `make packages`' (PACKAGES_DIR) and SigningKey the packages'
	// signing key (PACKAGE_SIGNING_KEY). Default: those variables.
	ImageDir, PackagesDir, SigningKey string
}

// Cluster is the installed release, running.
type Cluster struct {
	Kube      client.Client
	REST      *rest.Config
	Env       *testenv.Env
	Istiod    *testenv.Istiod
	Namespace string // the release namespace
	Host      string // the endpoint's DNS name (hosts[0])
	GatewayIP netip.Addr
	// ServingCA is the PEM CA of the serving certificate: what the
	// operator copies to the VMs.
	ServingCA []byte
	// RepositoryKeyFingerprints are the repository signing keys the
	// endpoint logged, what the operator publishes.
	RepositoryKeyFingerprints []string
	// IstiodAddr is istiod's plaintext gRPC address on the host, for
	// `istioctl proxy-status --plaintext`.
	IstiodAddr string
	// Rendered is the chart's output, as applied.
	Rendered []byte
	// Log is the endpoint container's output so far.
	Log func() string

	endpoint *container
}

// The pod network: the endpoint's Pod has PodIP inside netns embark-pod;
// the host's end (podHostIP) stands in for cluster Services the Pod uses.
const (
	podNetns         = "embark-pod"
	podHostCIDR      = "10.203.0.1/30"
	podPeerCIDR      = "10.203.0.2/30"
	endpointName     = "onboarding-endpoint"
	readinessTimeout = 3 * time.Minute
)

// StartCluster installs the chart as the README says on a new control plane
// with a real istiod and runs the endpoint's container from the image. A
// missing prerequisite fails the test (in CI) or skips it with the reason.
func StartCluster(t *testing.T, o ClusterOptions) *Cluster {
	t.Helper()
	o = clusterDefaults(t, o)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	env, err := testenv.Start(testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stop the control plane: %v", err)
		}
	})
	istiod, err := testenv.StartIstiod(t.Context(), env, testenv.IstiodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(istiod.Stop)

	c := &Cluster{Kube: env.Client, REST: env.Config, Env: env, Istiod: istiod, GatewayIP: o.GatewayIP, IstiodAddr: istiod.GRPCAddr}
	helm, err := readmeHelmInstall(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !o.ValuesFromREADME {
		helm.Sets, helm.Before = nil, nil
	}
	c.Namespace = helm.Namespace
	extra := o.ExtraValues
	if o.Values != nil {
		extra = append(append([]string(nil), extra...), o.Values(t, env)...)
	}
	c.Rendered = renderChart(t, root, helm, extra)
	objs := decodeObjects(t, c.Rendered)
	deploy := mustDeployment(t, objs)
	cfg := endpointConfig(t, objs)
	c.Host = cfg.Endpoint.Hosts[0]

	ca := operatorSetup(t, env, helm, cfg, o.SigningKey)
	c.ServingCA = ca.PEM
	applyRelease(t, env, root, helm, c.Rendered)

	pod := newPodNetwork(t, podNetns, podHostCIDR, podPeerCIDR, true)
	ctr, spec := runEndpoint(t, env, istiod, pod, deploy, cfg, o.ImageDir)
	c.Log, c.endpoint = ctr.Log, ctr
	forwardGateway(t, objs, spec, o.GatewayIP, pod.PeerIP)
	c.RepositoryKeyFingerprints = repositoryKeys(ctr.Log())
	return c
}

func clusterDefaults(t *testing.T, o ClusterOptions) ClusterOptions {
	t.Helper()
	if os.Geteuid() != 0 {
		needed(t, "the install test runs as root (network namespaces, runc)")
	}
	from := func(v *string, name string) {
		if *v == "" {
			*v = os.Getenv(name)
		}
	}
	from(&o.ImageDir, "EMBARK_IMAGE_DIR")
	from(&o.PackagesDir, "PACKAGES_DIR")
	from(&o.SigningKey, "PACKAGE_SIGNING_KEY")
	if o.ImageDir == "" {
		needed(t, "EMBARK_IMAGE_DIR names no image: run `make image` (make install-test sets it)")
	}
	if !o.GatewayIP.IsValid() {
		t.Fatal("ClusterOptions.GatewayIP is required: the VM network's host address")
	}
	return o
}

// needed fails the test in CI (CI=true) and skips it elsewhere, with why.
func needed(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// renderChart renders the chart of the README's command with Helm's Go SDK
// (the chart's render module, as manifests/chart_test.go runs it): its
// release, namespace and --set values, then the extra values files.
func renderChart(t *testing.T, root string, h helmInstall, extra []string) []byte {
	t.Helper()
	chart := filepath.Join(root, h.Chart)
	args := []string{"run", ".", "-namespace", h.Namespace, "-release", h.Release}
	for _, f := range extra {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-f", abs)
	}
	for _, s := range h.Sets {
		args = append(args, "-set", s)
	}
	cmd := exec.CommandContext(t.Context(), "go", append(args, chart)...)
	cmd.Dir = filepath.Join(chart, "render")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render the chart as the README installs it (%s): %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

func decodeObjects(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("rendered chart: %v", err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	var out T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &out); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return &out
}

func mustDeployment(t *testing.T, objs []*unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	u := find(objs, "Deployment", endpointName)
	if u == nil {
		t.Fatalf("the chart renders no Deployment %s", endpointName)
	}
	return convert[appsv1.Deployment](t, u)
}

// renderedConfig is what the test reads of the endpoint's rendered
// configuration file.
type renderedConfig struct {
	Namespace          string   `json:"namespace"`
	WorkloadNamespaces []string `json:"workloadNamespaces"`
	Endpoint           struct {
		Hosts      []string `json:"hosts"`
		SecretName string   `json:"secretName"`
	} `json:"endpoint"`
	Istiod struct {
		Address string `json:"address"`
	} `json:"istiod"`
}

func endpointConfig(t *testing.T, objs []*unstructured.Unstructured) renderedConfig {
	t.Helper()
	u := find(objs, "ConfigMap", endpointName)
	if u == nil {
		t.Fatalf("the chart renders no ConfigMap %s", endpointName)
	}
	raw, _, _ := unstructured.NestedString(u.Object, "data", "config.yaml")
	var cfg renderedConfig
	if err := sigsyaml.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("ConfigMap %s config.yaml: %v", endpointName, err)
	}
	if len(cfg.Endpoint.Hosts) == 0 || cfg.Endpoint.SecretName == "" {
		t.Fatalf("rendered configuration names no host or serving Secret:\n%s", raw)
	}
	return cfg
}

// operatorSetup does what the README and docs/install.md ask of an
// operator before `helm install`: the workload namespaces exist; the TLS
// Secret the values name holds a certificate for the host from a CA of
// the operator's own, with that CA as ca.crt (kubectl create secret, as
// docs/install.md shows it); then the README's own commands before `helm
// install`, run in a directory holding the repository's signing key as
// signing.asc (the packages' key, PACKAGE_SIGNING_KEY).
func operatorSetup(t *testing.T, env *testenv.Env, h helmInstall, cfg renderedConfig, signingKey string) *fixtures.CA {
	t.Helper()
	for _, ns := range append([]string{h.Namespace}, cfg.WorkloadNamespaces...) {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if err := env.Client.Create(t.Context(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
	ca, err := fixtures.NewCA("install test operator CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile, err := ca.ServingCert(dir, cfg.Endpoint.Hosts[0])
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := ca.WritePEM(caFile); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Kubectl(t.Context(), nil, "create", "secret", "generic", cfg.Endpoint.SecretName, "-n", h.Namespace,
		"--type=kubernetes.io/tls", "--from-file=tls.crt="+certFile, "--from-file=tls.key="+keyFile, "--from-file=ca.crt="+caFile); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if signingKey != "" {
		data, err := os.ReadFile(signingKey)
		if err != nil {
			t.Fatalf("PACKAGE_SIGNING_KEY: %v", err)
		}
		if err := os.WriteFile(filepath.Join(work, "signing.asc"), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, words := range h.Before {
		if err := operatorCommand(t.Context(), env, work, words); err != nil {
			t.Fatalf("README, before helm install: %v (PACKAGE_SIGNING_KEY=%q is signing.asc)", err, signingKey)
		}
	}
	return ca
}

// operatorCommand runs a kubectl command of the docs, as written, in dir,
// against the control plane; another command is an error naming it.
func operatorCommand(ctx context.Context, env *testenv.Env, dir string, words []string) error {
	if len(words) == 0 || words[0] != "kubectl" {
		return fmt.Errorf("%q: only kubectl commands are run here", strings.Join(words, " "))
	}
	bin := "kubectl"
	if assets, err := testenv.AssetsDir(""); err == nil {
		if _, err := os.Stat(filepath.Join(assets, "kubectl")); err == nil {
			bin = filepath.Join(assets, "kubectl")
		}
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", env.KubeconfigPath}, words[1:]...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(words, " "), err, out)
	}
	return nil
}

// applyRelease applies the chart's CRDs, then its rendered objects, with
// server-side apply (Helm's own field manager name), then the objects of
// docs/operator-guide.md's steps 3 to 5 (WorkloadGroup, OnboardingPolicy,
// Sidecar) and the service account step 3 names.
func applyRelease(t *testing.T, env *testenv.Env, root string, h helmInstall, rendered []byte) {
	t.Helper()
	apply := func(what string, data []byte) {
		t.Helper()
		if _, err := env.Kubectl(t.Context(), data, "apply", "--server-side", "--force-conflicts", "--field-manager=helm", "-f", "-"); err != nil {
			t.Fatalf("apply %s: %v", what, err)
		}
	}
	crds, err := filepath.Glob(filepath.Join(root, h.Chart, "crds", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("the chart's CRDs: %v (%d files)", err, len(crds))
	}
	for _, f := range crds {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		apply(f, data)
	}
	apply("the rendered chart", rendered)
	docs, err := guideObjects(filepath.Join(root, "docs", "operator-guide.md"), "3.", "4.", "5.")
	if err != nil {
		t.Fatal(err)
	}
	apply("docs/operator-guide.md's objects", []byte(strings.Join(docs, "---\n")))
	for _, d := range docs {
		var o struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Namespace string `json:"namespace"`
			} `json:"metadata"`
			Spec struct {
				Template struct {
					ServiceAccount string `json:"serviceAccount"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := sigsyaml.Unmarshal([]byte(d), &o); err != nil {
			t.Fatal(err)
		}
		if sa := o.Spec.Template.ServiceAccount; o.Kind == "WorkloadGroup" && sa != "" {
			if _, err := env.Kubectl(t.Context(), nil, "create", "sa", "-n", o.Metadata.Namespace, sa); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// runEndpoint runs the Deployment's endpoint container as a kubelet would
// on a node: its Secrets and ConfigMaps read from the API server once they
// exist, a token of its service account, the API server as the
// `kubernetes` Service inside the Pod's netns, istiod's Service name
// resolved (the Pod's /etc/hosts) to a forwarder to the real istiod, then
// waits for its readiness probe.
func runEndpoint(t *testing.T, env *testenv.Env, istiod *testenv.Istiod, pod *podNetwork, deploy *appsv1.Deployment, cfg renderedConfig, imageDir string) (*container, *corev1.Container) {
	t.Helper()
	spec := &deploy.Spec.Template.Spec
	c := findContainer(spec, endpointName)
	if c == nil {
		t.Fatalf("Deployment %s has no container %s", deploy.Name, endpointName)
	}
	meta := podMeta{Name: deploy.Name + "-0", Namespace: deploy.Namespace, PodIP: pod.PeerIP.String(), HostIP: pod.HostIP.String(), NodeName: "install-test"}

	src := podSources{Hosts: map[string]string{}}
	src.ConfigMaps, src.Secrets = podObjects(t, env, spec, deploy.Namespace)
	src.Token = serviceAccountToken(t, env, deploy.Namespace, spec.ServiceAccountName)
	src.CA = env.Config.CAData

	apiPort := kubernetesService(t, env, pod)
	if cfg.Istiod.Address != "" {
		host, port, err := net.SplitHostPort(cfg.Istiod.Address)
		if err != nil {
			t.Fatalf("istiod.address %q: %v", cfg.Istiod.Address, err)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(pod.HostIP.String(), port))
		if err != nil {
			t.Fatalf("istiod's Service stand-in: %v", err)
		}
		forward(t, ln, istiod.SecureGRPCAddr)
		src.Hosts[host] = pod.HostIP.String()
	}

	rootfs := filepath.Join(t.TempDir(), "rootfs")
	img, err := unpackImage(imageDir, rootfs)
	if err != nil {
		t.Fatalf("unpack the image of %s: %v", imageDir, err)
	}
	rt, err := materialize(spec, endpointName, meta, img, src, t.TempDir())
	if err != nil {
		t.Fatalf("kubelet stand-in: %v", err)
	}
	// The kubelet's service environment of the `kubernetes` Service, first.
	rt.Env = append([]string{"KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=" + strconv.Itoa(apiPort)}, rt.Env...)
	ctr := startContainer(t, "embark-install-"+endpointName, rt, rootfs, netnsPath(pod.Name))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("endpoint container output:\n%s", ctr.Log())
		}
	})
	if err := waitReady(t.Context(), ctr, c.ReadinessProbe, meta.PodIP, rt.Ports, readinessTimeout); err != nil {
		t.Fatalf("endpoint readiness probe: %v (the container output follows)", err)
	}
	return ctr, c
}

// podObjects reads the ConfigMaps and Secrets the Pod's volumes and env
// name, waiting (as the kubelet retries) for those that are not optional
// and not there yet, e.g. istio-ca-root-cert until istiod writes it.
func podObjects(t *testing.T, env *testenv.Env, spec *corev1.PodSpec, ns string) (map[string]*corev1.ConfigMap, map[string]*corev1.Secret) {
	t.Helper()
	cms, secrets := map[string]bool{}, map[string]bool{}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			cms[v.ConfigMap.Name] = cms[v.ConfigMap.Name] || !optional(v.ConfigMap.Optional)
		}
		if v.Secret != nil {
			secrets[v.Secret.SecretName] = secrets[v.Secret.SecretName] || !optional(v.Secret.Optional)
		}
	}
	for _, c := range spec.Containers {
		for _, e := range c.Env {
			if f := e.ValueFrom; f != nil && f.ConfigMapKeyRef != nil {
				cms[f.ConfigMapKeyRef.Name] = cms[f.ConfigMapKeyRef.Name] || !optional(f.ConfigMapKeyRef.Optional)
			}
			if f := e.ValueFrom; f != nil && f.SecretKeyRef != nil {
				secrets[f.SecretKeyRef.Name] = secrets[f.SecretKeyRef.Name] || !optional(f.SecretKeyRef.Optional)
			}
		}
		for _, f := range c.EnvFrom {
			if f.ConfigMapRef != nil {
				cms[f.ConfigMapRef.Name] = cms[f.ConfigMapRef.Name] || !optional(f.ConfigMapRef.Optional)
			}
			if f.SecretRef != nil {
				secrets[f.SecretRef.Name] = secrets[f.SecretRef.Name] || !optional(f.SecretRef.Optional)
			}
		}
	}
	outCM, outS := map[string]*corev1.ConfigMap{}, map[string]*corev1.Secret{}
	get := func(name string, required bool, obj client.Object) bool {
		key := client.ObjectKey{Namespace: ns, Name: name}
		err := fixtures.Poll(t.Context(), 200*time.Millisecond, time.Minute, func() error {
			err := env.Client.Get(t.Context(), key, obj)
			if apierrors.IsNotFound(err) && !required {
				return nil
			}
			return err
		})
		if err != nil {
			t.Fatalf("the Pod's %T %s/%s: %v", obj, ns, name, err)
		}
		return obj.GetName() != ""
	}
	for name, required := range cms {
		cm := &corev1.ConfigMap{}
		if get(name, required, cm) {
			outCM[name] = cm
		}
	}
	for name, required := range secrets {
		s := &corev1.Secret{}
		if get(name, required, s) {
			outS[name] = s
		}
	}
	return outCM, outS
}

func serviceAccountToken(t *testing.T, env *testenv.Env, ns, sa string) []byte {
	t.Helper()
	if sa == "" {
		sa = "default"
	}
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	expiry := int64(3600)
	tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of service account %s/%s: %v", ns, sa, err)
	}
	return []byte(tr.Status.Token)
}

// kubernetesService listens inside the Pod's netns on 127.0.0.1 (the API
// server's certificate names only 127.0.0.1 and localhost), on the API
// server's own port, and forwards to the API server; it returns the port.
// The same port makes the API server's URLs valid in the Pod as on the
// host: its service-account issuer (https://127.0.0.1:<port>/), whose
// discovery document and JWKS an endpoint trusting that issuer fetches.
func kubernetesService(t *testing.T, env *testenv.Env, pod *podNetwork) int {
	t.Helper()
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := pod.Listen("tcp", net.JoinHostPort("127.0.0.1", u.Port()))
	if err != nil {
		t.Fatalf("the kubernetes Service stand-in: %v", err)
	}
	forward(t, ln, u.Host)
	return ln.Addr().(*net.TCPAddr).Port
}

// forwardGateway stands in for the vmgateway load balancer: each of the
// rendered Service's ports on gateway, to the Pod's target port.
func forwardGateway(t *testing.T, objs []*unstructured.Unstructured, c *corev1.Container, gateway, podIP netip.Addr) {
	t.Helper()
	u := find(objs, "Service", "vmgateway")
	if u == nil {
		t.Fatal("the chart renders no Service vmgateway")
	}
	ports, err := servicePorts(convert[corev1.Service](t, u), c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(gateway.String(), strconv.Itoa(int(p.Port))))
		if err != nil {
			t.Fatalf("vmgateway port %s: %v", p.Name, err)
		}
		forward(t, ln, net.JoinHostPort(podIP.String(), strconv.Itoa(int(p.TargetPort))))
	}
}

// repositoryKeys are the fingerprints of the endpoint's log lines
// "local repository: apt and yum metadata signed" (JSON, key=...).
func repositoryKeys(log string) []string {
	var keys []string
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
			Key string `json:"key"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "local repository: apt and yum metadata signed" && line.Key != "" {
			keys = append(keys, line.Key)
		}
	}
	return keys
}
