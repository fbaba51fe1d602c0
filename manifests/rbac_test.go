package manifests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
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
	return objs
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
		{"list", "", "pods", "", ""},
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
	ns := env.Namespace(t)
	aws := awstest.Start(t, awstest.Instance{})

	dir := t.TempDir()
	certs := filepath.Join(dir, "aws-certs")
	if err := os.MkdirAll(certs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(certs, "us-east-2.pem"), aws.CA.CertificatePEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	// The manifests' configuration, with loopback listeners, plaintext and
	// the fake AWS instead of a serving Secret and the real AWS.
	onboardingAddr, metricsAddr, xdsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	cfgFile := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgFile, fmt.Appendf(nil, `apiVersion: config.onboarding.tetrate.io/v1alpha1
kind: OnboardingEndpointConfiguration
namespace: %s
endpoint:
  hosts: [%s]
  plaintext: true
identity:
  aws:
    certificatesDir: %s
    stsEndpoint: %s
listen:
  onboarding: %s
  metrics: %s
  xds: %s
`, cfg.Namespace, cfg.Endpoint.Hosts[0], certs, aws.STS.URL, onboardingAddr, metricsAddr, xdsAddr), 0o600); err != nil {
		t.Fatal(err)
	}

	policyYAML, err := os.ReadFile("../api/crds/testdata/seed004/policy-any-ec2-in-accounts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policy := &authorizationv1alpha1.OnboardingPolicy{}
	if err := sigsyaml.UnmarshalStrict(policyYAML, policy); err != nil {
		t.Fatal(err)
	}
	policy.Namespace = ns
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns, Labels: map[string]string{"app": "ratings"}}}
	wg.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": "ratings", "class": "vm"}, ServiceAccount: "ratings-vm", Network: "virtual-machines"}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm", Namespace: ns}}
	for _, obj := range []client.Object{policy, wg, sa} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, app.Options{ConfigFile: cfgFile, Kubeconfig: impersonatingKubeconfig(t), Replica: "rbac-test-0",
			DebugXDS: "off", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the endpoint did not start as its ServiceAccount: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the endpoint did not start as its ServiceAccount in 2m (a watch refused by RBAC keeps an informer from syncing)")
	}

	conn, err := grpc.NewClient(onboardingAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)
	cred, err := awsclient.Credential(ctx, imds.New(imds.Options{Endpoint: aws.IMDS.URL}), nil, cfg.Endpoint.Hosts[0])
	if err != nil {
		t.Fatal(err)
	}
	// A call the endpoint cannot finish (an informer RBAC keeps from
	// syncing blocks it) fails the test instead of hanging it.
	callCtx, cancelCalls := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelCalls()
	auth, err := api.Authorize(callCtx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: ns, Name: "ratings"},
		Credential: &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: &onboardingv1alpha1.AWSCredential{
			InstanceIdentityDocument: cred.Document, Rsa2048Signature: string(cred.Signature),
		}},
	})
	if err != nil {
		t.Fatalf("Authorize as the ServiceAccount: %v", err)
	}
	reg, err := api.Register(metadata.AppendToOutgoingContext(callCtx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
		Addresses: []*onboardingv1alpha1.HostAddress{{Ip: "172.31.5.254", Type: "VPC"}},
	})
	if err != nil {
		t.Fatalf("Register as the ServiceAccount: %v", err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: reg.GetRegistrationName()}, war); err != nil {
		t.Fatalf("registration %s: %v", reg.GetRegistrationName(), err)
	}
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: reg.GetRegistrationName()}, we); err != nil {
		t.Errorf("WorkloadEntry %s: %v", reg.GetRegistrationName(), err)
	}
	// Unregistering deletes the registration, also as the ServiceAccount.
	if _, err := api.Unregister(metadata.AppendToOutgoingContext(callCtx, "authorization", "Bearer "+auth.GetToken(), "embark-session-key", reg.GetSessionKey()), &onboardingv1alpha1.UnregisterRequest{}); err != nil {
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
