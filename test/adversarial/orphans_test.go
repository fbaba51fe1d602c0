package adversarial

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
)

// runScopedEndpoint runs the endpoint (standalone, plaintext on loopback)
// with ns as its own and only workload namespace, so that its sweeper
// looks at nothing of the other tests.
func runScopedEndpoint(t *testing.T, ns string) {
	t.Helper()
	cfg := configkit.Config(ns)
	cfg.WorkloadNamespaces = []string{ns}
	endpointkit.Start(t, endpointkit.Options{Config: cfg, Kubeconfig: env.KubeconfigPath, Replica: "orphans-" + ns})
}

// authenticated reports whether the API server authenticates token for
// istiod's CA audience, as istiod's CA asks it.
func authenticated(ctx context.Context, kube kubernetes.Interface, token string) (bool, error) {
	tr, err := kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{registry.AudienceIstioCA}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return tr.Status.Authenticated, nil
}

// A VM's registration is deleted with `kubectl delete war --cascade=orphan`:
// the garbage collector strips the owner references from its credential
// Secret and WorkloadEntry and leaves them. While the Secret exists the
// sidecar's bound token passes istiod's TokenReview, so the VM keeps
// getting mesh certificates from istiod directly, and its WorkloadEntry
// keeps it an endpoint. The running endpoint must remove both within a
// bounded time, and leave a live registration's alone.
func TestOrphanedCredentialKeepsGettingCertificates(t *testing.T) {
	Attack(t, "a registration deleted with --cascade=orphan leaves its credential Secret, whose token istiod still accepts, and its WorkloadEntry")
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
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	runScopedEndpoint(t, ns)
	registerVM := func(n int) *registry.Result {
		res, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity(fmt.Sprintf("i-%017x", n)), Registration: fixtures.Registration(fmt.Sprintf("10.1.0.%d", n))})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	orphaned, live := registerVM(1), registerVM(2)
	if ok, err := authenticated(ctx, kube, orphaned.SidecarToken.Token); err != nil || !ok {
		t.Fatalf("the fresh sidecar token is not authenticated for istio-ca: %v %v", ok, err)
	}

	if err := env.Client.Delete(ctx, orphaned.Registration, client.PropagationPolicy(metav1.DeletePropagationOrphan)); err != nil {
		t.Fatal(err)
	}
	// The garbage collector strips the owner references, then the
	// registration goes.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(orphaned.Registration), &runtimev1alpha1.WorkloadAutoRegistration{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("registration deleted with orphan propagation still there: %v", err)
	}

	secretKey := types.NamespacedName{Namespace: ns, Name: registry.SidecarSecretName(orphaned.Registration.Name)}
	entryKey := client.ObjectKeyFromObject(orphaned.WorkloadEntry)
	var secretGone, entryGone, tokenDead bool
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		secretGone = apierrors.IsNotFound(env.Client.Get(ctx, secretKey, &corev1.Secret{}))
		entryGone = apierrors.IsNotFound(env.Client.Get(ctx, entryKey, &istionetworkingv1.WorkloadEntry{}))
		ok, err := authenticated(ctx, kube, orphaned.SidecarToken.Token)
		if err != nil {
			return false, err
		}
		tokenDead = !ok
		return secretGone && entryGone && tokenDead, nil
	})
	if err != nil {
		t.Fatalf("a minute after the registration was deleted with orphan propagation: credential Secret gone %v, WorkloadEntry gone %v, token refused by TokenReview (istio-ca) %v: %v",
			secretGone, entryGone, tokenDead, err)
	}

	// The live registration keeps its Secret, entry and token.
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: registry.SidecarSecretName(live.Registration.Name)}, &corev1.Secret{}); err != nil {
		t.Errorf("the live registration's credential Secret: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(live.WorkloadEntry), &istionetworkingv1.WorkloadEntry{}); err != nil {
		t.Errorf("the live registration's WorkloadEntry: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(live.Registration), &runtimev1alpha1.WorkloadAutoRegistration{}); err != nil {
		t.Errorf("the live registration: %v", err)
	}
	if ok, err := authenticated(ctx, kube, live.SidecarToken.Token); err != nil || !ok {
		t.Errorf("the live registration's token is no longer authenticated: %v %v", ok, err)
	}
}
