package adversarial

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// manifestObjects decodes the YAML documents of the manifests' files, each
// object put in namespace ns when it is namespaced (kustomize's job in a
// real install).
func manifestObjects(t *testing.T, ns string, kinds map[string]bool, files ...string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatal(err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if kinds[u.GetKind()] {
				u.SetNamespace(ns)
			}
			objs = append(objs, u)
		}
	}
	return objs
}

// The endpoint's RBAC as the manifests install it (base/rbac.yaml, one
// workload namespace's RoleBinding), and an attacker holding the endpoint's
// ServiceAccount (a compromised endpoint): it reads no Secret and mints no
// token outside its workload namespaces, reads neither istiod's CA key nor
// any other Secret of istiod's namespace but its own two, and cannot plant
// a plug-in CA (cacerts) there.
func TestCompromisedEndpointOutsideItsNamespaces(t *testing.T) {
	Attack(t, "a compromised endpoint reads Secrets (istiod's CA key) or mints tokens outside its workload namespaces")
	ctx := t.Context()
	wl, other := env.Namespace(t), env.Namespace(t)
	for _, ns := range []string{"istio-system", "kube-system"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	objs := manifestObjects(t, "istio-system", map[string]bool{"Role": true, "RoleBinding": true}, "../../manifests/base/rbac.yaml")
	objs = append(objs, manifestObjects(t, wl, map[string]bool{"RoleBinding": true}, "../../manifests/workload-namespaces/bookinfo.yaml")...)
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	admin := kubernetes.NewForConfigOrDie(env.Config)
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio-ca-secret"}, Data: map[string][]byte{"ca-key.pem": []byte("the mesh's CA key")}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "bootstrap-token-abcdef"}},
	} {
		if _, err := admin.CoreV1().Secrets(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if _, err := admin.CoreV1().ServiceAccounts(other).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "admin"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:istio-system:onboarding-endpoint",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:istio-system", "system:authenticated"}}
	endpoint := kubernetes.NewForConfigOrDie(cfg).CoreV1()
	// Control, once RBAC's cache has the bindings: the endpoint lists the
	// Secrets of its workload namespace.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := endpoint.Secrets(wl).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the endpoint cannot list the Secrets of its workload namespace %s: %v", wl, err)
	}
	token := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}}}
	attempts := map[string]error{}
	_, attempts["get istiod's CA key istio-system/istio-ca-secret"] = endpoint.Secrets("istio-system").Get(ctx, "istio-ca-secret", metav1.GetOptions{})
	_, attempts["list the Secrets of istio-system"] = endpoint.Secrets("istio-system").List(ctx, metav1.ListOptions{})
	_, attempts["create a plug-in CA istio-system/cacerts"] = endpoint.Secrets("istio-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cacerts"}}, metav1.CreateOptions{})
	_, attempts["list the Secrets of kube-system"] = endpoint.Secrets("kube-system").List(ctx, metav1.ListOptions{})
	_, attempts["list the Secrets of a namespace not configured"] = endpoint.Secrets(other).List(ctx, metav1.ListOptions{})
	_, attempts["list the Secrets of every namespace"] = endpoint.Secrets("").List(ctx, metav1.ListOptions{})
	_, attempts["mint a token of a service account in a namespace not configured"] = endpoint.ServiceAccounts(other).CreateToken(ctx, "admin", token, metav1.CreateOptions{})
	_, attempts["mint a token of kube-system's default service account"] = endpoint.ServiceAccounts("kube-system").CreateToken(ctx, "default", token, metav1.CreateOptions{})
	for what, err := range attempts {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as the endpoint: %v, want Forbidden", what, err)
		}
	}
}
