package burst

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry/write"
	"github.com/embark-mesh/embark/test/fixtures"
)

// requestsPerWrite is the endpoint's client rate limit per write of its
// budget (cmd/onboarding-endpoint/app: three requests per write).
const requestsPerWrite = 3

// rawVM is one VM's objects as the burst stored them.
type rawVM struct {
	registration  *runtimev1alpha1.WorkloadAutoRegistration
	workloadEntry *istionetworkingv1.WorkloadEntry
	secret        *corev1.Secret
}

// rawAPI measures the API server alone on the burst's API calls: the
// objects Embark stored in ns for the burst's VMs, created again in a new
// namespace by len(vms) clients at once (each VM's calls one after
// another: registration, WorkloadEntry, Secret, then a TokenRequest of the
// same audiences and lifetime bound to the Secret), with the endpoint's
// client rate limit. It returns the time and the number of API calls.
func rawAPI(b *testing.B, ns string, vms []*vm) (time.Duration, int) {
	b.Helper()
	ctx := b.Context()
	objs := storedObjects(b, ns, len(vms))
	audiences, lifetime, err := tokenClaims(vms[0].token)
	if err != nil {
		b.Fatal(err)
	}
	to := cluster.Env.Namespace(b)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: fixtures.ServiceAccount, Namespace: to}}
	if err := cluster.Env.Client.Create(ctx, sa); err != nil {
		b.Fatal(err)
	}
	cfg := *cluster.Env.Config
	cfg.QPS, cfg.Burst = float32(requestsPerWrite*write.DefaultQPS), requestsPerWrite*write.DefaultBurst
	c, err := client.New(&cfg, client.Options{Scheme: cluster.Env.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(objs))
	start := time.Now()
	for _, o := range objs {
		wg.Go(func() {
			if err := o.create(ctx, c, to, sa, audiences, lifetime); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("raw API baseline: %v (and %d more failures)", err, len(errs))
	}
	return took, 4 * len(objs)
}

// storedObjects reads every registration, WorkloadEntry and sidecar
// credential Secret of ns from the API server; there must be n of each.
func storedObjects(b *testing.B, ns string, n int) []rawVM {
	b.Helper()
	ctx := b.Context()
	var wars runtimev1alpha1.WorkloadAutoRegistrationList
	var wes istionetworkingv1.WorkloadEntryList
	var secrets corev1.SecretList
	for _, l := range []client.ObjectList{&wars, &wes, &secrets} {
		if err := cluster.Env.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
			b.Fatal(err)
		}
	}
	var sidecar []corev1.Secret
	for _, s := range secrets.Items {
		if ref := metav1.GetControllerOf(&s); ref != nil && ref.Kind == "WorkloadAutoRegistration" {
			sidecar = append(sidecar, s)
		}
	}
	if len(wars.Items) != n || len(wes.Items) != n || len(sidecar) != n {
		b.Fatalf("namespace %s holds %d registrations, %d WorkloadEntries and %d sidecar Secrets after a burst of %d VMs", ns, len(wars.Items), len(wes.Items), len(sidecar), n)
	}
	out := make([]rawVM, n)
	for i := range out {
		out[i] = rawVM{registration: &wars.Items[i], workloadEntry: wes.Items[i], secret: &sidecar[i]}
	}
	return out
}

// create creates o's objects (changed in place) again in namespace to, with their names,
// labels, annotations and content but none of the server's fields, owner
// references (the owners' UIDs differ) or finalizers (nothing here would
// remove them), then a TokenRequest of sa bound to the new Secret.
func (o rawVM) create(ctx context.Context, c client.Client, to string, sa *corev1.ServiceAccount, audiences []string, lifetime int64) error {
	war, we := o.registration, o.workloadEntry
	war.ObjectMeta, war.Status = fresh(war.ObjectMeta, to), runtimev1alpha1.WorkloadAutoRegistrationStatus{}
	we.ObjectMeta = fresh(we.ObjectMeta, to)
	secret := &corev1.Secret{ObjectMeta: fresh(o.secret.ObjectMeta, to), Type: o.secret.Type, Data: o.secret.Data}
	for _, obj := range []client.Object{war, we, secret} {
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %T %s: %w", obj, obj.GetName(), err)
		}
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: audiences, ExpirationSeconds: ptr.To(lifetime),
		BoundObjectRef: &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Secret", Name: secret.Name, UID: secret.UID},
	}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		return fmt.Errorf("TokenRequest bound to Secret %s: %w", secret.Name, err)
	}
	return nil
}

// fresh is m's name, labels and annotations in namespace ns.
func fresh(m metav1.ObjectMeta, ns string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: ns, Labels: m.Labels, Annotations: m.Annotations}
}

// tokenClaims reads the audiences and the lifetime (exp - iat, seconds) of
// a sidecar token, to request tokens of the same kind. The token is this
// benchmark's own, issued by the API server: it is decoded, not verified.
func tokenClaims(token string) ([]string, int64, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, 0, fmt.Errorf("sidecar token: %d parts, want 3", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, 0, fmt.Errorf("sidecar token payload: %w", err)
	}
	var claims struct {
		Aud []string `json:"aud"`
		Exp int64    `json:"exp"`
		Iat int64    `json:"iat"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return nil, 0, fmt.Errorf("sidecar token claims: %w", err)
	}
	if len(claims.Aud) == 0 || claims.Exp <= claims.Iat {
		return nil, 0, fmt.Errorf("sidecar token claims: audiences %v, exp %d, iat %d", claims.Aud, claims.Exp, claims.Iat)
	}
	return claims.Aud, claims.Exp - claims.Iat, nil
}

// directSigning measures istiod alone on the burst's certificates: each
// VM's CSR sent straight to istiod's secure port with the VM's token, all
// at once, each VM on its own connection, established before the clock
// starts (the bound leaves connecting out). Any refusal fails the run.
func directSigning(b *testing.B, d *deployment, vms []*vm) time.Duration {
	b.Helper()
	ctx := b.Context()
	conns := make([]*grpc.ClientConn, len(vms))
	for i := range vms {
		conn, err := grpc.NewClient(d.istiod.SecureGRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(d.istiodTLS())))
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		conns[i] = conn
	}
	ready(b, conns)
	var wg sync.WaitGroup
	errs := make(chan error, len(vms))
	start := time.Now()
	for i, v := range vms {
		wg.Go(func() {
			if _, err := v.certificate(ctx, securityv1alpha1.NewIstioCertificateServiceClient(conns[i]), d.istiod.RootPool(), nil); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("istiod signing baseline: %v (and %d more failures)", err, len(errs))
	}
	return took
}

// ready connects conns and waits until each is ready.
func ready(b *testing.B, conns []*grpc.ClientConn) {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	for _, c := range conns {
		c.Connect()
	}
	for _, c := range conns {
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if s == connectivity.Idle {
				c.Connect()
			}
			if !c.WaitForStateChange(ctx, s) {
				b.Fatalf("connection to istiod not ready: %v", ctx.Err())
			}
		}
	}
}
