package manifests

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

const (
	serviceAccountUser = "system:serviceaccount:istio-system:onboarding-endpoint"
	endpointHost       = "onboarding-endpoint.example.corp"
)

var serviceAccountGroups = []string{"system:serviceaccounts", "system:serviceaccounts:istio-system", "system:authenticated"}

// applyBase stores the base's ServiceAccount, RBAC and ConfigMap for real.
func applyBase(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	_, objs := build(t, "base")
	applyObjects(t, objs)
	return objs
}

// applyObjects stores the ServiceAccount, RBAC and ConfigMap of objs for
// real (server-side apply); the rest is left out.
func applyObjects(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	var keep []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap":
			keep = append(keep, o)
		}
	}
	var docs []string
	for _, o := range keep {
		data, err := sigsyaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(data))
	}
	if _, err := env.Kubectl(t.Context(), []byte(strings.Join(docs, "---\n")), "apply", "--server-side", "--force-conflicts",
		"--field-manager=embark-test", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// access is one API call the endpoint makes (or must not be able to make).
type access struct {
	verb, group, resource, subresource string
	namespace                          string // "" = all namespaces / cluster
}

func (a access) String() string {
	r := a.resource
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	return fmt.Sprintf("%s %s.%s in %q", a.verb, r, a.group, a.namespace)
}

// Every call of the endpoint's code is allowed to the ServiceAccount, and
// what it does not need is not. The list mirrors docs/security.md.
func TestRBACGrantsExactlyWhatTheCodeCalls(t *testing.T) {
	applyBase(t)
	const wl = "bookinfo" // any workload namespace
	allowed := []access{
		{"list", "networking.istio.io", "workloadgroups", "", ""},
		{"watch", "networking.istio.io", "workloadgroups", "", ""},
		{"get", "networking.istio.io", "workloadgroups", "", wl},
		{"create", "networking.istio.io", "workloadentries", "", wl},
		{"update", "networking.istio.io", "workloadentries", "", wl},
		{"delete", "networking.istio.io", "workloadentries", "", wl},
		{"watch", "networking.istio.io", "workloadentries", "", ""},
		{"list", "authorization.onboarding.tetrate.io", "onboardingpolicies", "", ""},
		{"watch", "authorization.onboarding.tetrate.io", "onboardingpolicies", "", ""},
		{"create", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "", wl},
		{"update", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "", wl},
		{"delete", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "", wl},
		{"update", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "status", wl},
		{"update", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "finalizers", wl},
		{"update", "networking.istio.io", "workloadgroups", "finalizers", wl},
		{"list", "", "secrets", "", ""},
		{"watch", "", "secrets", "", ""},
		{"create", "", "secrets", "", wl},
		{"get", "", "serviceaccounts", "", wl},
		{"watch", "", "serviceaccounts", "", ""},
		{"create", "", "serviceaccounts", "token", wl},
		{"create", "authentication.k8s.io", "tokenreviews", "", ""},
		{"update", "networking.istio.io", "workloadentries", "status", wl},
		{"watch", "networking.istio.io", "sidecars", "", ""},
		{"watch", "networking.istio.io", "serviceentries", "", ""},
		{"watch", "security.istio.io", "peerauthentications", "", ""},
		{"watch", "security.istio.io", "authorizationpolicies", "", ""},
		{"watch", "security.istio.io", "requestauthentications", "", ""},
		{"watch", "", "pods", "", ""},
		{"watch", "", "services", "", ""},
		{"watch", "discovery.k8s.io", "endpointslices", "", ""},
		{"create", "", "events", "", wl},
		{"patch", "", "events", "", wl},
		{"update", "", "secrets", "", "istio-system"},
		{"create", "coordination.k8s.io", "leases", "", "istio-system"},
		{"update", "coordination.k8s.io", "leases", "", "istio-system"},
		{"delete", "coordination.k8s.io", "leases", "", "istio-system"},
	}
	denied := []access{
		{"update", "", "secrets", "", wl},
		{"delete", "", "secrets", "", wl},
		{"create", "", "pods", "", wl},
		// Pods are read (service accounts of endpoints), never entered.
		{"create", "", "pods", "exec", wl},
		{"get", "", "pods", "log", wl},
		{"update", "networking.istio.io", "sidecars", "", wl},
		{"create", "", "serviceaccounts", "", wl},
		{"update", "networking.istio.io", "workloadgroups", "", wl},
		{"create", "authorization.onboarding.tetrate.io", "onboardingpolicies", "", wl},
		{"create", "coordination.k8s.io", "leases", "", wl},
		{"update", "rbac.authorization.k8s.io", "clusterroles", "", ""},
		{"impersonate", "", "serviceaccounts", "", wl},
		{"create", "authorization.k8s.io", "subjectaccessreviews", "", ""},
	}
	cs := kubernetes.NewForConfigOrDie(env.Config)
	check := func(a access, want bool) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: serviceAccountUser, Groups: serviceAccountGroups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace,
			},
		}}
		res, err := cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status.Allowed != want {
			t.Errorf("%s: allowed=%v, want %v (%s)", a, res.Status.Allowed, want, res.Status.Reason)
		}
	}
	for _, a := range allowed {
		check(a, true)
	}
	for _, a := range denied {
		check(a, false)
	}
}

// impersonatingKubeconfig writes a kubeconfig that acts as the endpoint's
// ServiceAccount (the admin credentials impersonate it; the API server
// authorizes every request as the ServiceAccount).
func impersonatingKubeconfig(t *testing.T) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(env.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = serviceAccountUser
		ai.ImpersonateGroups = serviceAccountGroups
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The real endpoint, running as the manifests' ServiceAccount with the
// manifests' RBAC, starts (informers, signing key, Leases) and onboards a
// workload (registration, WorkloadEntry, sidecar Secret and token).
func TestRBACIsSufficientToOnboardAWorkload(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	objs := applyBase(t)
	cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", "onboarding-endpoint"))
	f := newWorkloadFixture(t)
	addrs := newEndpointAddrs(t)
	cfgFile := writeEndpointConfig(t, cfg.Namespace, cfg.Endpoint.Hosts[0], f, addrs)
	done := runEndpoint(t, ctx, cfgFile, impersonatingKubeconfig(t), "rbac-test-0")

	name, token := onboard(t, ctx, addrs.onboarding, cfg.Endpoint.Hosts[0], f, "172.31.5.254")
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, war); err != nil {
		t.Fatalf("registration %s: %v", name, err)
	}
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, we); err != nil {
		t.Errorf("WorkloadEntry %s: %v", name, err)
	}
	// Unregistering deletes the registration, also as the ServiceAccount.
	if err := unregister(t, ctx, addrs.onboarding, token); err != nil {
		t.Errorf("Unregister as the ServiceAccount: %v", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the endpoint stopped with %v", err)
		}
	case <-time.After(time.Minute):
		t.Error("the endpoint did not stop")
	}
}
