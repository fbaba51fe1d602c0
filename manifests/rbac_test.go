package manifests

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

const serviceAccountUser = "system:serviceaccount:istio-system:onboarding-endpoint"

var serviceAccountGroups = []string{"system:serviceaccounts", "system:serviceaccounts:istio-system", "system:authenticated"}

// applyBase stores the base's ServiceAccount, RBAC, signing-key Secret and
// ConfigMap for real, and binds the endpoint's workload rights in each of
// workloadNamespaces with the RoleBinding of workload-namespaces/ (the test
// namespaces stand for bookinfo).
func applyBase(t *testing.T, workloadNamespaces ...string) []*unstructured.Unstructured {
	t.Helper()
	_, objs := build(t, "base")
	_, wl := build(t, "workload-namespaces")
	binding := mustFind(t, wl, "RoleBinding", workloadRoleBinding)
	keep := objs
	for _, ns := range workloadNamespaces {
		b := binding.DeepCopy()
		b.SetNamespace(ns)
		keep = append(keep[:len(keep):len(keep)], b)
	}
	applyObjects(t, keep)
	return objs
}

// applyObjects stores the ServiceAccount, RBAC, Secrets and ConfigMap of
// objs for real (server-side apply); the rest is left out. A
// ClusterRoleBinding other than the base's (standalone's mesh
// configuration) is deleted when the test ends: the other tests must not
// see its rights.
func applyObjects(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	var keep []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Secret":
			keep = append(keep, o)
		}
		if o.GetKind() == "ClusterRoleBinding" && o.GetName() != "embark-onboarding-endpoint" {
			t.Cleanup(func() {
				if err := env.Client.Delete(context.WithoutCancel(t.Context()), o); err != nil {
					t.Errorf("delete ClusterRoleBinding %s: %v", o.GetName(), err)
				}
			})
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

// Every call of the endpoint's code is allowed to the ServiceAccount where
// it makes it, and nothing else: the namespaced rights only in a workload
// namespace, nothing cluster-wide but TokenReview. The list mirrors
// docs/security.md ("Least privilege").
func TestRBACGrantsExactlyWhatTheCodeCalls(t *testing.T) {
	wl := env.Namespace(t) // a workload namespace (bookinfo in the manifests)
	other := env.Namespace(t)
	applyBase(t, wl)
	allowed := []access{
		{"list", "networking.istio.io", "workloadgroups", "", wl},
		{"watch", "networking.istio.io", "workloadgroups", "", wl},
		{"get", "networking.istio.io", "workloadgroups", "", wl},
		{"create", "networking.istio.io", "workloadentries", "", wl},
		{"update", "networking.istio.io", "workloadentries", "", wl},
		{"delete", "networking.istio.io", "workloadentries", "", wl},
		{"watch", "networking.istio.io", "workloadentries", "", wl},
		{"list", "authorization.onboarding.tetrate.io", "onboardingpolicies", "", wl},
		{"watch", "authorization.onboarding.tetrate.io", "onboardingpolicies", "", wl},
		{"update", "authorization.onboarding.tetrate.io", "onboardingpolicies", "status", wl},
		{"create", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "", wl},
		{"update", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "", wl},
		{"delete", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "", wl},
		{"watch", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "", wl},
		{"update", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "status", wl},
		{"update", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "finalizers", wl},
		{"update", "runtime.onboarding.tetrate.io", "workloadgrouprollouts", "", wl},
		{"update", "networking.istio.io", "workloadgroups", "finalizers", wl},
		{"list", "", "secrets", "", wl},
		{"watch", "", "secrets", "", wl},
		{"create", "", "secrets", "", wl},
		{"delete", "", "secrets", "", wl},
		{"get", "", "serviceaccounts", "", wl},
		{"watch", "", "serviceaccounts", "", wl},
		{"create", "", "serviceaccounts", "token", wl},
		{"create", "authentication.k8s.io", "tokenreviews", "", ""},
		{"update", "networking.istio.io", "workloadentries", "status", wl},
		{"create", "", "events", "", wl},
		{"patch", "", "events", "", wl},
		{"create", "coordination.k8s.io", "leases", "", "istio-system"},
		{"update", "coordination.k8s.io", "leases", "", "istio-system"},
		{"delete", "coordination.k8s.io", "leases", "", "istio-system"},
	}
	denied := []access{
		// Nothing namespaced cluster-wide.
		{"list", "", "secrets", "", ""},
		{"watch", "", "secrets", "", ""},
		{"list", "networking.istio.io", "workloadgroups", "", ""},
		{"list", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "", ""},
		// Not in a namespace that is not a workload namespace: no Secret
		// read, no token minted (kube-system's, istiod's CA key).
		{"get", "", "secrets", "", "kube-system"},
		{"list", "", "secrets", "", "kube-system"},
		{"get", "", "secrets", "", other},
		{"list", "", "secrets", "", other},
		{"create", "", "secrets", "", other},
		{"create", "", "serviceaccounts", "token", "kube-system"},
		{"create", "", "serviceaccounts", "token", other},
		{"create", "", "serviceaccounts", "token", "istio-system"},
		{"create", "networking.istio.io", "workloadentries", "", other},
		{"create", "runtime.onboarding.tetrate.io", "workloadautoregistrations", "", other},
		{"list", "networking.istio.io", "workloadgroups", "", other},
		{"update", "authorization.onboarding.tetrate.io", "onboardingpolicies", "status", other},
		{"update", "authorization.onboarding.tetrate.io", "onboardingpolicies", "status", ""},
		// Istiod mode (the base) reads no mesh configuration: that is
		// standalone's ClusterRoleBinding (standalone/).
		{"watch", "networking.istio.io", "sidecars", "", ""},
		{"watch", "", "pods", "", ""},
		{"watch", "", "services", "", ""},
		{"watch", "discovery.k8s.io", "endpointslices", "", ""},
		// What the workload rights never include.
		{"update", "", "secrets", "", wl},
		{"delete", "", "secrets", "", other},
		{"delete", "", "secrets", "", "kube-system"},
		{"delete", "", "secrets", "", "istio-system"},
		{"create", "", "pods", "", wl},
		{"create", "", "pods", "exec", wl},
		{"get", "", "pods", "log", wl},
		{"update", "networking.istio.io", "sidecars", "", wl},
		{"create", "", "serviceaccounts", "", wl},
		{"update", "networking.istio.io", "workloadgroups", "", wl},
		{"create", "authorization.onboarding.tetrate.io", "onboardingpolicies", "", wl},
		{"create", "coordination.k8s.io", "leases", "", wl},
		{"update", "rbac.authorization.k8s.io", "clusterroles", "", ""},
		{"create", "rbac.authorization.k8s.io", "rolebindings", "", wl},
		// istiod's namespace: no Secret but its own two, by name (below),
		// and no create: not istiod's CA key, not a plug-in CA (cacerts).
		{"list", "", "secrets", "", "istio-system"},
		{"create", "", "secrets", "", "istio-system"},
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
	// Secrets of istiod's namespace, by name.
	named := []struct {
		verb, name string
		want       bool
	}{
		{"get", "onboarding-token-signing-key", true},
		{"update", "onboarding-token-signing-key", true},
		{"watch", "onboarding-token-signing-key", true},
		{"get", "onboarding-endpoint-tls", true},
		{"update", "onboarding-endpoint-tls", false},
		{"get", "istio-ca-secret", false},
		{"get", "cacerts", false},
		{"update", "cacerts", false},
	}
	for _, n := range named {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: serviceAccountUser, Groups: serviceAccountGroups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: n.verb, Resource: "secrets", Namespace: "istio-system", Name: n.name},
		}}
		res, err := cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status.Allowed != n.want {
			t.Errorf("%s Secret istio-system/%s: allowed=%v, want %v", n.verb, n.name, res.Status.Allowed, n.want)
		}
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

// The real endpoint, running as the manifests' ServiceAccount with exactly
// the manifests' RBAC (the base, the workload namespace's RoleBinding and,
// in standalone mode, standalone/), starts (informers scoped to the
// workload namespace, signing key, Leases) and onboards a workload
// (registration, WorkloadEntry, sidecar Secret and token, the policy's
// status); a WorkloadGroup in a namespace it was not given is refused at
// once, naming the namespace; and the API server refuses it Secrets and
// tokens elsewhere.
func TestRBACIsSufficientToOnboardAWorkload(t *testing.T) {
	for _, mode := range []string{"istiod", "standalone"} {
		t.Run(mode, func(t *testing.T) { onboardWithManifestRBAC(t, mode) })
	}
}

func onboardWithManifestRBAC(t *testing.T, mode string) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f := newWorkloadFixture(t)
	// The same policy, group and account in a namespace the endpoint was
	// not given.
	other := env.Namespace(t)
	f.seed(t, other)
	objs := applyBase(t, f.ns)
	cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", "onboarding-endpoint"))
	// istiod mode: istiod at an address where nothing listens (nothing
	// here asks it); standalone: none, and standalone/'s binding.
	istiod := func(*config.Configuration) {}
	if mode == "istiod" {
		chartIstiod := config.Istiod{Address: fixtures.FreeAddr(t), ServerName: cfg.Istiod.ServerName, RootCertFile: fixtures.RootFile(t, t.TempDir(), "istiod-root.pem", "absent istiod")}
		istiod = func(c *config.Configuration) { c.Istiod = chartIstiod }
	} else {
		_, sa := build(t, "standalone")
		applyObjects(t, sa)
	}
	addrs := newEndpointAddrs(t)
	host := cfg.Endpoint.Hosts[0]
	cfgFile := writeEndpointConfig(t, cfg.Namespace, host, f, addrs, istiod)
	done := runEndpoint(t, ctx, cfgFile, impersonatingKubeconfig(t), "rbac-test-0")

	name, token := onboard(t, ctx, addrs.onboarding, host, f, "172.31.5.254")
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, war); err != nil {
		t.Fatalf("registration %s: %v", name, err)
	}
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, we); err != nil {
		t.Errorf("WorkloadEntry %s: %v", name, err)
	}
	// The policy's status, written as the ServiceAccount, names the group
	// it selects and the allow.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var p authorizationv1alpha1.OnboardingPolicyList
		if err := env.Client.List(ctx, &p, client.InNamespace(f.ns)); err != nil || len(p.Items) != 1 {
			return false, err
		}
		st := p.Items[0].Status
		return st.SelectedWorkloadGroupCount == 1 && len(st.SelectedWorkloadGroups) == 1 && st.SelectedWorkloadGroups[0] == "ratings" &&
			st.LastAllowedTime != nil, nil
	}); err != nil {
		t.Errorf("OnboardingPolicy status does not show the selected group and the allow: %v", err)
	}

	// A WorkloadGroup in a namespace not configured: refused at once,
	// naming the namespace (the endpoint neither watches nor may write
	// there; nothing waits on a cache that will never hold it).
	conn, err := grpc.NewClient(addrs.onboarding, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, cancelCall := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelCall()
	_, err = authorize(t, callCtx, onboardingv1alpha1.NewOnboardingServiceClient(conn), host, f, other)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), `"`+other+`"`) {
		t.Errorf("Authorize for %s/ratings (not a workload namespace) = %v, want FailedPrecondition naming %q", other, err, other)
	}

	// What a compromised endpoint would try, as its ServiceAccount: the
	// API server refuses it Secrets and tokens outside its workload
	// namespace.
	asEndpoint, err := clientcmd.BuildConfigFromFlags("", impersonatingKubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ecs := kubernetes.NewForConfigOrDie(asEndpoint)
	for _, target := range []string{other, "kube-system"} {
		if _, err := ecs.CoreV1().Secrets(target).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("list Secrets in %s as the endpoint: %v, want Forbidden", target, err)
		}
	}
	if _, err := ecs.CoreV1().ServiceAccounts(other).CreateToken(ctx, "ratings-vm", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("mint a token of %s/ratings-vm as the endpoint: %v, want Forbidden", other, err)
	}
	if _, err := ecs.CoreV1().Secrets(f.ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list Secrets in the workload namespace %s as the endpoint (control): %v", f.ns, err)
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
