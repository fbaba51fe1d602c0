//go:build install

package install

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/embark-mesh/embark/test/testenv"
)

// The on-prem host of docs/identity.md's "On-prem set-up": a service
// account per host, named like the host, in namespace onprem of the
// cluster whose service-account issuer stands in for a corporate OIDC
// issuer (the test's kube-apiserver).
const (
	onPremSubject   = "vm-01.example.com"
	onPremNamespace = "onprem"
	identityDoc     = "../../docs/identity.md"
	identitySection = "JWT (on-premises hosts)"
	// Where the endpoint's Pod mounts the issuer's CA (extraVolumes).
	issuerCADir = "/etc/embark/oidc"
)

// onPremIssuer is the kube-apiserver's service-account issuer, set up as
// docs/identity.md has an operator set it up for the endpoint.
type onPremIssuer struct {
	kube     kubernetes.Interface
	issuer   string // the exact iss of its tokens
	audience string // the endpoint's first host
}

// setUp, once the control plane runs: the host's service account; the
// issuer's discovery readable without credentials (the docs' cluster role
// binding); the docs' identity.jwt values filled in as an operator does
// (the issuer, the endpoint's host as audience, caFile where the Pod mounts
// the API server's CA). It returns the values files of the release:
// simulatedWorldValues with the CA's volume, and identity.jwt.
func (o *onPremIssuer) setUp(t *testing.T, env *testenv.Env, simulated func(...hostMount) string) []string {
	t.Helper()
	ctx := t.Context()
	var err error
	o.kube, err = kubernetes.NewForConfig(env.Config)
	must(t, err)
	_, err = o.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: onPremNamespace}}, metav1.CreateOptions{})
	must(t, err)
	_, err = o.kube.CoreV1().ServiceAccounts(onPremNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: onPremSubject}}, metav1.CreateOptions{})
	must(t, err)
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "oidc-reviewer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:service-account-issuer-discovery"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: "system:unauthenticated"}},
	}
	_, err = o.kube.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	must(t, err)
	o.issuer = tokenIssuer(t, o.mint(ctx, t))

	caDir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(caDir, "issuer-ca.pem"), env.Config.CAData, 0o644))
	must(t, os.Chmod(caDir, 0o755))
	block := identityJWTBlock(t)
	values, err := fillIn(block, map[string]string{
		"https://kubernetes.corp.example.com": o.issuer,
		"onboarding.example.com":              o.audience,
		"/etc/embark/issuer-ca.pem":           issuerCADir + "/issuer-ca.pem",
	})
	if err != nil {
		t.Fatalf("%s, %q: the identity.jwt block: %v\n%s", identityDoc, identitySection, err, block)
	}
	file := filepath.Join(t.TempDir(), "identity-jwt.yaml")
	must(t, os.WriteFile(file, []byte(values), 0o600))
	return []string{simulated(hostMount{Name: "oidc-issuer-ca", HostPath: caDir, MountPath: issuerCADir}), file}
}

// identityJWTBlock is the ```yaml block of docs/identity.md's JWT section
// that sets identity.jwt (the configuration file's section, which the
// chart's `identity` value is).
func identityJWTBlock(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(identityDoc)
	must(t, err)
	for _, sec := range sections(string(data)) {
		if sec.heading != identitySection {
			continue
		}
		for _, b := range codeBlocks(sec.body, "yaml") {
			if strings.HasPrefix(b, "identity:\n  jwt:") {
				return b
			}
		}
	}
	t.Fatalf("%s: no ```yaml block starting with identity.jwt under %q", identityDoc, identitySection)
	return ""
}

// allow applies docs/identity.md's on-prem OnboardingPolicy, filled in as
// an operator does: the issuer, and the on-prem hosts' addresses (cidr).
func (o *onPremIssuer) allow(t *testing.T, c *Cluster, cidr string) {
	t.Helper()
	docs, err := guideObjects(identityDoc, identitySection)
	must(t, err)
	var policy string
	for _, d := range docs {
		if strings.Contains(d, "\nkind: OnboardingPolicy\n") {
			policy = d
		}
	}
	if policy == "" {
		t.Fatalf("%s: no OnboardingPolicy under %q", identityDoc, identitySection)
	}
	policy, err = fillIn(policy, map[string]string{"https://kubernetes.corp.example.com": o.issuer, "10.20.30.0/24": cidr})
	if err != nil {
		t.Fatalf("%s: the on-prem OnboardingPolicy: %v", identityDoc, err)
	}
	if _, err := c.Env.Kubectl(t.Context(), []byte(policy), "apply", "-f", "-"); err != nil {
		t.Fatalf("apply %s's OnboardingPolicy: %v\n%s", identityDoc, err, policy)
	}
}

// mint returns a fresh token of the on-prem host for the endpoint's
// audience, as docs/identity.md's `kubectl create token ... --duration 10m`.
func (o *onPremIssuer) mint(ctx context.Context, t *testing.T) string {
	t.Helper()
	token, err := o.mintErr(ctx)
	must(t, err)
	return token
}

func (o *onPremIssuer) mintErr(ctx context.Context) (string, error) {
	tr, err := o.kube.CoreV1().ServiceAccounts(onPremNamespace).CreateToken(ctx, onPremSubject, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{o.audience}, ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of %s/%s: %w", onPremNamespace, onPremSubject, err)
	}
	return tr.Status.Token, nil
}

// tokenIssuer is the iss claim of token (unverified: the test minted it).
func tokenIssuer(t *testing.T, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("a token of %d parts", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	must(t, err)
	var claims struct {
		Iss string `json:"iss"`
	}
	must(t, json.Unmarshal(raw, &claims))
	if claims.Iss == "" {
		t.Fatal("the token names no issuer")
	}
	return claims.Iss
}

// readmeHost is hosts[0] of README.md's `helm install` (--set hosts[0]=),
// the endpoint's host before the chart is rendered.
func readmeHost(t *testing.T) string {
	t.Helper()
	h, err := readmeHelmInstall("../../README.md")
	must(t, err)
	for _, s := range h.Sets {
		if v, ok := strings.CutPrefix(s, "hosts[0]="); ok {
			return v
		}
	}
	t.Fatal("README.md's helm install sets no hosts[0]")
	return ""
}
