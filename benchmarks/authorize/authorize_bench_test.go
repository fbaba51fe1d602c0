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

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
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
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
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

// scaleAccount is the account of the instance the scale benchmark
// onboards (awstest's default).
const scaleAccount = "123456789012"

// scalePolicies returns n OnboardingPolicies: n-1 unrelated ones, each for
// another account (shaped like the narrow example policy: partition,
// region, zones, IAM roles, a label selector), and last in name order the
// one that allows scaleAccount: its rule 0 lets any of its EC2 instances
// join "ratings" (the document path), its rule 1 those proving the role
// bench-role join "reviews" (the STS-proof path).
func scalePolicies(ns string, n int) []*authorizationv1alpha1.OnboardingPolicy {
	out := make([]*authorizationv1alpha1.OnboardingPolicy, 0, n)
	for i := range n - 1 {
		out = append(out, &authorizationv1alpha1.OnboardingPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("policy-%04d", i), Namespace: ns},
			Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
				Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{
					Partitions: []authorizationv1alpha1.AWSPartition{"aws"},
					Accounts:   []string{fmt.Sprintf("%012d", 100000000000+i)},
					Regions:    []string{"us-east-2"},
					Zones:      []string{"us-east-2a", "us-east-2b"},
					EC2:        &authorizationv1alpha1.EC2Matcher{IAMRoleNames: []string{"bench-role"}},
				}}},
				OnboardTo: []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{
					MatchLabels: map[string]string{"app": []string{"ratings", "reviews"}[i%2]},
				}}},
			}}},
		})
	}
	selector := func(app string) []authorizationv1alpha1.OnboardTarget {
		return []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
	}
	return append(out, &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("policy-%04d", n-1), Namespace: ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{
			{
				Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{scaleAccount}, EC2: &authorizationv1alpha1.EC2Matcher{}}}},
				OnboardTo: selector("ratings"),
			},
			{
				Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{scaleAccount}, EC2: &authorizationv1alpha1.EC2Matcher{IAMRoleNames: []string{"bench-role"}}}}},
				OnboardTo: selector("reviews"),
			},
		}},
	})
}

// scaleNamespace creates a namespace holding the WorkloadGroups "ratings"
// and "reviews" and the n policies of scalePolicies, and waits until the
// informer cache holds them all.
func scaleNamespace(b *testing.B, n int) string {
	ctx := b.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-scale-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(ctx), ns) })
	for _, app := range []string{"ratings", "reviews"} {
		wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns.Name, Labels: map[string]string{"app": app}}}
		wg.Spec.Template = &istioapi.WorkloadEntry{ServiceAccount: app + "-vm"}
		if err := env.Client.Create(ctx, wg); err != nil {
			b.Fatal(err)
		}
	}
	for _, p := range scalePolicies(ns.Name, n) {
		if err := env.Client.Create(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		list := &authorizationv1alpha1.OnboardingPolicyList{}
		wgs := &istionetworkingv1.WorkloadGroupList{}
		if err := cached.List(ctx, list, client.InNamespace(ns.Name)); err != nil {
			b.Fatal(err)
		}
		if err := cached.List(ctx, wgs, client.InNamespace(ns.Name)); err != nil {
			b.Fatal(err)
		}
		if len(list.Items) == n && len(wgs.Items) == 2 {
			return ns.Name
		}
		if time.Now().After(deadline) {
			b.Fatalf("cache holds %d of %d policies, %d of 2 WorkloadGroups", len(list.Items), n, len(wgs.Items))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkAuthorizeScale is what the onboarding endpoint does to authorize
// an EC2 instance, with the Authorizer the endpoint builds (watching the
// policy informer), in a namespace holding one OnboardingPolicy (the one
// that allows) or a thousand (999 for other accounts, then that one), on
// every core:
//
//   - document: verify the instance identity document, Authorize;
//   - sts: verify the document, Precheck (the rule needs a proven role),
//     verify the document and the signed sts:GetCallerIdentity request
//     (over loopback HTTP to a fake STS), Authorize.
//
// With the policies indexed, the thousand cost what the one does.
func BenchmarkAuthorizeScale(b *testing.B) {
	ctx := b.Context()
	aws := awstest.Start(b, awstest.Instance{Role: "bench-role"})
	imdsClient := imds.New(imds.Options{Endpoint: aws.IMDS.URL})
	stsClient := awsclient.NewSTSClient(imdsClient, "us-east-2", func(o *sts.Options) { o.BaseEndpoint = &aws.STS.URL })
	cred, err := awsclient.Credential(ctx, imdsClient, stsClient, "bench.example.com")
	if err != nil {
		b.Fatal(err)
	}
	verifier, err := awsidentity.NewVerifier("bench.example.com",
		awsidentity.WithTrustedCertificates(map[string]*x509.Certificate{"us-east-2": aws.CA.Certificate}),
		awsidentity.WithSTSEndpoint(aws.STS.URL), awsidentity.WithReplayCacheSize(0))
	if err != nil {
		b.Fatal(err)
	}
	docOnly := *cred
	docOnly.STS = nil
	authz, err := policy.NewAuthorizer(cached, &record.FakeRecorder{})
	if err != nil {
		b.Fatal(err)
	}
	if err := authz.WatchPolicies(ctx, cached); err != nil {
		b.Fatal(err)
	}
	document := func(ns string) error {
		id, err := verifier.Verify(ctx, docOnly)
		if err != nil {
			return err
		}
		_, err = authz.Authorize(ctx, ns, "ratings", endpoint.APIIdentity(id))
		return err
	}
	withSTS := func(ns string) error {
		docID, err := verifier.Verify(ctx, docOnly)
		if err != nil {
			return err
		}
		d, err := authz.Precheck(ctx, ns, "reviews", endpoint.APIIdentity(docID))
		if err != nil {
			return err
		}
		if d.Allowed || !d.NeedsIAMRoleProof {
			return fmt.Errorf("precheck: allowed %v, needs a proof %v; want a denial a proof lifts", d.Allowed, d.NeedsIAMRoleProof)
		}
		id, err := verifier.Verify(ctx, *cred)
		if err != nil {
			return err
		}
		_, err = authz.Authorize(ctx, ns, "reviews", endpoint.APIIdentity(id))
		return err
	}
	for _, n := range []int{1, 1000} {
		ns := scaleNamespace(b, n)
		for _, path := range []struct {
			name string
			run  func(ns string) error
		}{{"document", document}, {"sts", withSTS}} {
			b.Run(fmt.Sprintf("%s/policies=%d", path.name, n), func(b *testing.B) {
				if err := path.run(ns); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := path.run(ns); err != nil {
							b.Error(err)
							return
						}
					}
				})
				reportPerCore(b)
			})
		}
	}
}
