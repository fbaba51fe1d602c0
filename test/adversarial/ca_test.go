package adversarial

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/xds/ca"
)

// startCARelay runs the endpoint for ns with an istiod configured at an
// address where nothing listens, and returns a certificate client of its
// xDS address.
func startCARelay(t *testing.T, ns string) securityv1alpha1.IstioCertificateServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(startCARelayAddr(t, ns), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return securityv1alpha1.NewIstioCertificateServiceClient(conn)
}

// startCARelayAddr runs the endpoint as startCARelay does and returns its
// xDS address.
func startCARelayAddr(t *testing.T, ns string) string {
	t.Helper()
	cfg := configkit.Config(ns)
	cfg.Istiod = config.Istiod{Address: fixtures.FreeAddr(t), ServerName: "istiod.istio-system.svc",
		RootCertFile: fixtures.RootFile(t, t.TempDir(), "istiod-root.pem", "absent istiod")}
	return endpointkit.Start(t, endpointkit.Options{Config: cfg, Kubeconfig: env.KubeconfigPath, Replica: "ca-" + ns}).Config.Listen.XDS
}

func TestCertificateRequestsNeedALiveRegistrationsToken(t *testing.T) {
	ns := env.Namespace(t)
	ctx := t.Context()
	wg := fixtures.WorkloadGroup(ns, nil)
	fixtures.CreateGroup(ctx, t, env.Client, wg)
	c, err := env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) }, &istionetworkingv1.WorkloadEntryList{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	registerVM := func(n int) *registry.Result {
		res, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity(fmt.Sprintf("i-%017x", n)), Registration: fixtures.Registration(fmt.Sprintf("10.1.0.%d", n))})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	live, deleted := registerVM(1), registerVM(2)
	if err := env.Client.Delete(ctx, deleted.Registration); err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	// A plain token of the group's service account for istiod's audience:
	// what a pod of that service account holds, not bound to a registration.
	plain, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, fixtures.ServiceAccount, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca", registry.DefaultXDSAudience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca := startCARelay(t, ns)
	ask := func(token string) error {
		ctx := t.Context()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		_, err := ca.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: "-----BEGIN CERTIFICATE REQUEST-----", ValidityDuration: 3600})
		return err
	}
	// Control: the live registration's token passes Embark's checks and
	// fails only because istiod is absent.
	if err := ask(live.SidecarToken.Token); status.Code(err) != codes.Unavailable {
		t.Fatalf("live registration's token: %v, want Unavailable from the absent istiod", err)
	}
	tests := []struct {
		attack string
		token  string
		want   []codes.Code
	}{
		{attack: "certificate request without a token", want: []codes.Code{codes.Unauthenticated}},
		{attack: "certificate request with a deleted registration's sidecar token", token: deleted.SidecarToken.Token, want: []codes.Code{codes.Unauthenticated, codes.PermissionDenied}},
		{attack: "certificate request with a plain service-account token of the group's service account", token: plain.Status.Token, want: []codes.Code{codes.Unauthenticated}},
		{attack: "certificate request with a garbage bearer token", token: "not-a-jwt", want: []codes.Code{codes.Unauthenticated}},
	}
	for _, tt := range tests {
		t.Run(tt.attack, func(t *testing.T) {
			Attack(t, tt.attack)
			var err error
			// The deleted registration's Secret disappears through the
			// garbage collector: wait for the refusal.
			_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				err = ask(tt.token)
				return status.Code(err) != codes.Unavailable, nil
			})
			got := status.Code(err)
			ok := false
			for _, w := range tt.want {
				ok = ok || got == w
			}
			if !ok {
				t.Errorf("CreateCertificate = %v, want one of %v", err, tt.want)
			}
		})
	}
}

// caFrom is a certificate client of addr whose connections leave from the
// loopback address src.
func caFrom(t *testing.T, src, addr string) securityv1alpha1.IstioCertificateServiceClient {
	t.Helper()
	return securityv1alpha1.NewIstioCertificateServiceClient(dialFrom(t, src, addr))
}

// An unauthenticated flood from many source addresses, each within its own
// per-source rate, must not spend the relay's shared budget (50/s, burst
// 100 by default) that authenticated sidecars need: before the fix the
// relay charged the shared bucket before it looked at the token, so
// anyone who could reach the xDS port kept every VM from getting its
// certificate.
func TestUnauthenticatedFloodStarvesCertificateRequests(t *testing.T) {
	Attack(t, "unauthenticated certificate requests from many sources spend the CA relay's shared budget")
	ns := env.Namespace(t)
	ctx := t.Context()
	wg := fixtures.WorkloadGroup(ns, nil)
	fixtures.CreateGroup(ctx, t, env.Client, wg)
	c, err := env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) }, &istionetworkingv1.WorkloadEntryList{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	live, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity("i-00000000000000001"), Registration: fixtures.Registration("10.1.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	xdsAddr := startCARelayAddr(t, ns)
	csr := &securityv1alpha1.IstioCertificateRequest{Csr: "-----BEGIN CERTIFICATE REQUEST-----", ValidityDuration: 3600}

	// The flood: 16 source addresses, each asking without a token as fast
	// as its per-source bucket lets it (20/s each by default: 320/s in
	// all, over the shared 50/s).
	floodCtx, stopFlood := context.WithCancel(ctx)
	var wgFlood sync.WaitGroup
	var sent atomic.Int64
	for i := range 16 {
		ca := caFrom(t, fmt.Sprintf("127.0.1.%d", i+1), xdsAddr)
		wgFlood.Add(1)
		go func() {
			defer wgFlood.Done()
			for floodCtx.Err() == nil {
				_, err := ca.CreateCertificate(floodCtx, csr)
				if status.Code(err) == codes.ResourceExhausted {
					// Over this source's own rate: wait as a client would.
					select {
					case <-floodCtx.Done():
					case <-time.After(25 * time.Millisecond):
					}
					continue
				}
				sent.Add(1)
			}
		}()
	}
	defer func() { stopFlood(); wgFlood.Wait() }()
	// Let the flood spend what it can: at least the shared burst (100)
	// must have reached the relay's handler.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return sent.Load() >= 2*ca.DefaultBurst, nil
	}); err != nil {
		t.Fatalf("the flood reached the relay %d times in 1m, want %d (the attack did not run)", sent.Load(), 2*ca.DefaultBurst)
	}
	// The victim, from its own address, during the flood: its live token
	// passes Embark's checks and fails only because istiod is absent.
	victim := caFrom(t, "127.0.2.1", xdsAddr)
	vctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+live.SidecarToken.Token)
	for i := range 10 {
		_, err := victim.CreateCertificate(vctx, csr)
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("authenticated request %d during the flood (%d unauthenticated requests reached the relay): %v, want Unavailable from the absent istiod", i, sent.Load(), err)
		}
		time.Sleep(50 * time.Millisecond) // within the victim's own per-source rate
	}
}
