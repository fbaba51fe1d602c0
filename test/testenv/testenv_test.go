package testenv

import (
	"bytes"
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/test/fixtures"
	istioapinetworking "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var env *Env

func TestMain(m *testing.M) { Main(m, Options{GarbageCollector: true}, &env) }

func TestIstioCRDsAreInstalled(t *testing.T) {
	ns := env.Namespace(t)
	we := &istionetworkingv1.WorkloadEntry{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: ns},
		Spec:       istioapinetworking.WorkloadEntry{Address: "10.0.0.1", Labels: map[string]string{"app": "ratings"}},
	}
	if err := env.Client.Create(t.Context(), we); err != nil {
		t.Fatalf("create WorkloadEntry: %v", err)
	}
	// Istio's own schema validation is active: a WorkloadEntry without an
	// address or network is refused by the CRD's CEL rule.
	bad := &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: ns}}
	if err := env.Client.Create(t.Context(), bad); !apierrors.IsInvalid(err) {
		t.Errorf("create WorkloadEntry without address: %v, want Invalid", err)
	}
	for _, kind := range []client.ObjectList{
		&istionetworkingv1.WorkloadGroupList{}, &istionetworkingv1.SidecarList{}, &istionetworkingv1.ServiceEntryList{},
	} {
		if err := env.Client.List(t.Context(), kind, client.InNamespace(ns)); err != nil {
			t.Errorf("list %T: %v", kind, err)
		}
	}
}

func TestGarbageCollectorDeletesDependents(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: ns}}
	if err := env.Client.Create(ctx, owner); err != nil {
		t.Fatal(err)
	}
	dependent := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: "dependent", Namespace: ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}},
	}}
	if err := env.Client.Create(ctx, dependent); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, owner); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(dependent), &corev1.ConfigMap{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("dependent not garbage-collected: %v", err)
	}
}

// TokenRequest and TokenReview work, as the sidecar credential design needs.
func TestServiceAccountTokens(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: fixtures.ServiceAccount, Namespace: ns}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	review, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token, Audiences: []string{"istio-ca"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenReview: %v", err)
	}
	if !review.Status.Authenticated || review.Status.User.Username != "system:serviceaccount:"+ns+":"+fixtures.ServiceAccount {
		t.Errorf("TokenReview status = %+v", review.Status)
	}
}

func TestKubectlUsesTheControlPlane(t *testing.T) {
	out, err := env.Kubectl(t.Context(), nil, "get", "crd", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"workloadautoregistrations.runtime.onboarding.tetrate.io", "workloadgroups.networking.istio.io", "sidecars.networking.istio.io"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get crd lacks %s", want)
		}
	}
}

func TestDecodeCRDsRejectsOtherKinds(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		wantErr string
	}{
		{name: "not a CRD", data: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", wantErr: `is a "ConfigMap"`},
		{name: "empty", data: "---\n", wantErr: "holds no CustomResourceDefinition"},
		{name: "not YAML", data: "{", wantErr: "decode document 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeCRDs([]byte(tt.data), "x.yaml")
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestIstiodStartsAndRestarts(t *testing.T) {
	ctx := t.Context()
	istiod, err := StartIstiod(ctx, env, IstiodOptions{})
	if err != nil {
		t.Fatalf("start istiod: %v", err)
	}
	t.Cleanup(func() { _ = istiod.Close() })
	root := istiod.RootPool()
	if root.Equal(x509.NewCertPool()) {
		t.Fatalf("istiod's root certificate is empty: %q", istiod.RootCert)
	}
	var secret corev1.Secret
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: IstiodNamespace, Name: "istio-ca-secret"}, &secret); err != nil {
		t.Fatalf("istiod's CA secret: %v", err)
	}
	istiod.Stop()
	if err := istiod.Start(ctx); err != nil {
		t.Fatalf("restart istiod: %v", err)
	}
	if !bytes.Equal(istiod.RootCert, []byte(secret.Data["ca-cert.pem"])) {
		t.Errorf("after a restart istiod publishes another root than its CA secret's")
	}
}
