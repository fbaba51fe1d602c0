package integration_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/test/fixtures"
)

// The Role docs/onboarding-token.md gives the endpoint is enough: the
// informer's field-selected list and watch are authorized by resourceNames,
// and nothing else is readable.
func TestTheDocumentedRoleIsEnough(t *testing.T) {
	for _, tt := range []struct {
		name string
		// installed: the install creates the Secret empty and the Role
		// grants no create (the manifests' way: istiod's CA key lives in
		// the same namespace).
		installed bool
	}{{name: "endpoint creates the Secret"}, {name: "install creates it empty, no create right", installed: true}} {
		t.Run(tt.name, func(t *testing.T) { documentedRoleIsEnough(t, tt.installed) })
	}
}

func documentedRoleIsEnough(t *testing.T, installed bool) {
	ctx := t.Context()
	ns := env.Namespace(t)
	admin := secrets(t)
	const user = "embark-onboarding-endpoint"
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "onboarding-token-signing-key"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{secretName}, Verbs: []string{"get", "list", "watch", "update"}},
		},
	}
	if installed {
		empty := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName}}
		if _, err := admin.Secrets(ns).Create(ctx, empty, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	} else {
		role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}})
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "onboarding-token-signing-key"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if err := env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	restricted := cs.CoreV1()

	// RBAC is enforced: another Secret is out of reach (wait for the
	// authorizer's cache to see the binding first).
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}}
	if _, err := admin.Secrets(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := restricted.Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (installed && err == nil), nil
	})
	if err != nil {
		t.Fatalf("the binding never took effect: %v", err)
	}
	if _, err := restricted.Secrets(ns).Get(ctx, "other", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("get another secret: %v, want Forbidden", err)
	}
	if _, err := restricted.Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list all secrets: %v, want Forbidden", err)
	}

	if installed {
		if _, err := restricted.Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cacerts"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("create another Secret (istiod's plug-in CA name): %v, want Forbidden", err)
		}
	}
	set, err := token.EnsureKeySecret(ctx, restricted, ns, secretName)
	if err != nil {
		t.Fatalf("EnsureKeySecret with the Role: %v", err)
	}
	src := token.NewSecretKeySource(restricted, ns, secretName, token.WithSourceLogger(fixtures.DebugLogger(t)))
	srcCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Start(srcCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitCtx, cancelWait := context.WithTimeout(ctx, timeout)
	defer cancelWait()
	if err := src.WaitForKeys(waitCtx); err != nil {
		t.Fatalf("source with the Role: %v", err)
	}
	if got := src.KeySet().Current().ID(); got != set.Current().ID() {
		t.Errorf("source holds %s, want %s", got, set.Current().ID())
	}
	rotated, err := token.Rotate(ctx, restricted, ns, secretName)
	if err != nil {
		t.Fatalf("Rotate with the Role: %v", err)
	}
	iss := newIssuer(t, src)
	waitForKeyID(t, iss, ns, rotated.Current().ID())
}
