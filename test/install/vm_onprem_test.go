//go:build install

package install

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
)

// onPremSubject is the on-prem host's JWT subject: a service account of the
// test kube-apiserver, whose issuer stands in for a corporate OIDC issuer
// (as onboarding/agent/integration's on-prem test does).
const onPremSubject = "vm-01.example.com"

// onPremIssuer makes the apiserver's service-account issuer usable by the
// endpoint (its discovery public, its CA written to caFile) and allows the
// on-prem host in bookinfo: its JWT subject, from the VM network's
// addresses (a JWT proves no address). It returns the issuer.
func (w *vmWorld) onPremIssuer(t *testing.T, caFile string) (issuer, ca string) {
	t.Helper()
	ctx := t.Context()
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "embark-install-test-issuer-discovery"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:service-account-issuer-discovery"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: "system:unauthenticated"}},
	}
	_, err := w.kube.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	must(t, err)
	_, err = w.kube.CoreV1().ServiceAccounts("bookinfo").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: onPremSubject}}, metav1.CreateOptions{})
	must(t, err)
	parts := strings.Split(w.mintJWT(ctx, t), ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	must(t, err)
	var claims struct {
		Iss string `json:"iss"`
	}
	must(t, json.Unmarshal(raw, &claims))
	must(t, os.WriteFile(caFile, w.env.Config.CAData, 0o600))
	policy := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "on-prem", Namespace: "bookinfo"},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads:    []authorizationv1alpha1.WorkloadMatcher{{JWT: &authorizationv1alpha1.JWTMatcher{Issuer: claims.Iss, Subjects: []string{onPremSubject}}}},
			AddressCIDRs: []authorizationv1alpha1.CIDR{authorizationv1alpha1.CIDR(w.net.PeerIP.String() + "/32")},
			OnboardTo:    []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{}}},
		}}},
	}
	must(t, w.env.Client.Create(ctx, policy))
	return claims.Iss, caFile
}

// mintJWT returns a fresh token for the on-prem host, for the endpoint's
// audience (its host name).
func (w *vmWorld) mintJWT(ctx context.Context, t *testing.T) string {
	t.Helper()
	token, err := w.mintJWTErr(ctx)
	must(t, err)
	return token
}

func (w *vmWorld) mintJWTErr(ctx context.Context) (string, error) {
	tr, err := w.kube.CoreV1().ServiceAccounts("bookinfo").CreateToken(ctx, onPremSubject, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{vmTestHost}, ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}
