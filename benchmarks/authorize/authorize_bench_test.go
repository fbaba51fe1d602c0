package authorize

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"runtime"
	"testing"
	"time"

	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/policy"
	"github.com/embark-mesh/embark/test/testenv"
)

var (
	env    *testenv.Env
	cached cache.Cache
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env, func(ctx context.Context) error {
		var err error
		cached, err = env.StartCache(ctx, nil, &istionetworkingv1.WorkloadGroupList{}, &authorizationv1alpha1.OnboardingPolicyList{})
		return err
	})
}

// reportPerCore reports the rate of the whole benchmark divided by
// GOMAXPROCS.
func reportPerCore(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/float64(runtime.GOMAXPROCS(0)), "ops/s/core")
}

// BenchmarkBaselineRSA2048Verify is one RSA-2048 PKCS#1 v1.5 SHA-256
// verification of a precomputed digest, on every core.
func BenchmarkBaselineRSA2048Verify(b *testing.B) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		b.Fatal(err)
	}
	digest := sha256.Sum256([]byte("instance identity document"))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := rsa.VerifyPKCS1v15(&key.PublicKey, crypto.SHA256, digest[:], sig); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportPerCore(b)
}

// BenchmarkVerifyAndAuthorize verifies an instance identity document and
// evaluates the namespace's OnboardingPolicies (ten policies, the last one
// allowing) for the WorkloadGroup from the informer cache, on every core.
func BenchmarkVerifyAndAuthorize(b *testing.B) {
	ctx := b.Context()
	ca, err := awstest.NewCA("us-east-2")
	if err != nil {
		b.Fatal(err)
	}
	doc := awstest.Instance{}.Document()
	sig, err := ca.Sign(doc)
	if err != nil {
		b.Fatal(err)
	}
	verifier, err := awsidentity.NewVerifier("bench.example.com", awsidentity.WithTrustedCertificates(map[string]*x509.Certificate{"us-east-2": ca.Certificate}))
	if err != nil {
		b.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(ctx), ns) })
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns.Name, Labels: map[string]string{"app": "ratings"}}}
	wg.Spec.Template = &istioapi.WorkloadEntry{ServiceAccount: "ratings-vm"}
	objs := []client.Object{wg}
	// Nine policies for other accounts, then the one that allows.
	for i := range 10 {
		account := fmt.Sprintf("%012d", i+1)
		if i == 9 {
			account = "123456789012"
		}
		objs = append(objs, &authorizationv1alpha1.OnboardingPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("policy-%d", i), Namespace: ns.Name},
			Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
				Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{account}, EC2: &authorizationv1alpha1.EC2Matcher{}}}},
				OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
			}}},
		})
	}
	for _, obj := range objs {
		if err := env.Client.Create(ctx, obj); err != nil {
			b.Fatal(err)
		}
	}
	authz, err := policy.NewAuthorizer(cached, &record.FakeRecorder{})
	if err != nil {
		b.Fatal(err)
	}
	authorize := func() error {
		id, err := verifier.Verify(ctx, awsidentity.Credential{Document: doc, Signature: sig})
		if err != nil {
			return err
		}
		_, err = authz.Authorize(ctx, ns.Name, "ratings", endpoint.APIIdentity(id))
		return err
	}
	// Wait until the cache holds all ten policies (until then, denied).
	deadline := time.Now().Add(30 * time.Second)
	for {
		list := &authorizationv1alpha1.OnboardingPolicyList{}
		if err := cached.List(ctx, list, client.InNamespace(ns.Name)); err != nil {
			b.Fatal(err)
		}
		if len(list.Items) == 10 && authorize() == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("cache holds %d policies, authorize: %v", len(list.Items), authorize())
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := authorize(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportPerCore(b)
}
