package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	endpointconfig "github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
)

// onPremHost is the service account whose tokens the on-prem host presents:
// its name is the host name, the subject the policy allows.
const onPremHost = "vm-01.example.com"

// An on-prem host onboards with a JWT of a real OIDC issuer: the test
// kube-apiserver's own service-account issuer stands in for a corporate
// one. The endpoint finds its keys by OIDC discovery
// (/.well-known/openid-configuration, then jwks_uri), trusting the
// apiserver's CA; the issuer's subjectPrefix turns
// system:serviceaccount:<ns>:vm-01.example.com into the host's subject.
// A token-refresher on the host writes a fresh token (TokenRequest, 10m,
// with its own jti) every second, as each onboarding needs a fresh one.
func TestOnPremHostOnboardsWithOIDCIssuer(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	kube, err := kubernetes.NewForConfig(env.Config)
	must(t, err)

	// The issuer's discovery document and JWKS are public, as Kubernetes
	// documents for service-account issuer discovery.
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "embark-test-service-account-issuer-discovery"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:service-account-issuer-discovery"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: "system:unauthenticated"}},
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = kube.CoreV1().ServiceAccounts(w.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: onPremHost}}, metav1.CreateOptions{})
	must(t, err)
	mintToken := func() string {
		t.Helper()
		tr, err := kube.CoreV1().ServiceAccounts(w.ns).CreateToken(ctx, onPremHost, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{endpointHost}, ExpirationSeconds: ptr.To[int64](600)},
		}, metav1.CreateOptions{})
		must(t, err)
		return tr.Status.Token
	}
	first := mintToken()
	claims := tokenClaims(t, first)
	issuer, _ := claims["iss"].(string)
	if !strings.HasPrefix(issuer, "https://") || claims["jti"] == nil {
		t.Fatalf("the apiserver's token: iss %q, jti %v; want an https issuer and a jti", issuer, claims["jti"])
	}

	caFile := filepath.Join(w.dir, "issuer-ca.pem")
	must(t, os.WriteFile(caFile, env.Config.CAData, 0o600))
	w.cfg.Identity.JWT = []endpointconfig.JWTIssuer{{Issuer: issuer, ShortName: "kube", SubjectPrefix: "system:serviceaccount:" + w.ns + ":",
		CAFile: caFile, MaxTokenLifetime: configkit.Duration(15 * time.Minute)}}
	policy := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "on-prem", Namespace: w.ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{JWT: &authorizationv1alpha1.JWTMatcher{Issuer: issuer, Subjects: []string{onPremHost}}}},
			// A JWT proves no address: the host's address is allowed by an
			// explicit rule (docs/security.md, address proof).
			AddressCIDRs: []authorizationv1alpha1.CIDR{"10.20.30.0/24"},
			OnboardTo:    []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{}}},
		}}},
	}
	must(t, env.Client.Create(ctx, policy))
	w.startEndpoint()

	root := t.TempDir()
	tokenFile := filepath.Join(root, "host-token")
	must(t, os.WriteFile(tokenFile, []byte(first), 0o600))
	refresh, stopRefresh := context.WithCancel(ctx)
	refreshed := make(chan struct{})
	go func() {
		defer close(refreshed)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-refresh.Done():
				return
			case <-tick.C:
			}
			tr, err := kube.CoreV1().ServiceAccounts(w.ns).CreateToken(refresh, onPremHost, &authenticationv1.TokenRequest{
				Spec: authenticationv1.TokenRequestSpec{Audiences: []string{endpointHost}, ExpirationSeconds: ptr.To[int64](600)},
			}, metav1.CreateOptions{})
			if err == nil {
				_ = os.WriteFile(tokenFile+".tmp", []byte(tr.Status.Token), 0o600)
				_ = os.Rename(tokenFile+".tmp", tokenFile)
			}
		}
	}()
	defer func() { stopRefresh(); <-refreshed }()

	// The on-prem host: no IMDS, a token file, and its own address (not
	// loopback, which the endpoint refuses).
	w.runAgent(agentRun{agentFiles: agentFiles{platform: jwtTokenFileHost(tokenFile), addresses: []string{"10.20.30.40"}}})

	fixtures.Eventually(t, 60*time.Second, "the on-prem host registered", func() bool { return len(w.registrations()) == 1 })
	war := w.registrations()[0]
	id := war.Spec.Identity.JWT
	if id == nil || id.Issuer != issuer || id.ShortName != "kube" || id.Subject != onPremHost {
		t.Fatalf("registration identity %+v, want issuer %s, shortName kube, subject %s", war.Spec.Identity, issuer, onPremHost)
	}
	// docs/identity.md: <group>-jwt-<shortName>-<subject>-<16 hex digits of
	// SHA-256(issuer NUL subject)>, the subject's dots kept.
	if want := registry.RegistrationName("ratings", registry.IdentityName(war.Spec.Identity), 0); war.Name != want || !strings.HasPrefix(war.Name, "ratings-jwt-kube-vm-01.example.com") {
		t.Errorf("registration name %s, want %s, starting ratings-jwt-kube-vm-01.example.com", war.Name, want)
	}
	t.Logf("on-prem host registered as %s with identity %+v", war.Name, *id)
}

// tokenClaims decodes a JWT's claims without verifying it (test-side only).
func tokenClaims(t *testing.T, token string) map[string]any {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %d parts", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	must(t, err)
	out := map[string]any{}
	must(t, json.Unmarshal(raw, &out))
	return out
}
