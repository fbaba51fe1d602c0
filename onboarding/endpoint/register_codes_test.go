package endpoint

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/fixtures"
)

const (
	narrowPolicy = "../../api/crds/testdata/seed004/policy-narrow-ec2-subset.yaml"
	widePolicy   = "../../api/crds/testdata/seed004/policy-any-ec2-in-accounts.yaml"
)

// registerRequest is what the agent at ip sends by default.
func registerRequest(ip string) *onboardingv1alpha1.RegisterRequest {
	return &onboardingv1alpha1.RegisterRequest{
		Addresses:           []*onboardingv1alpha1.HostAddress{{Ip: ip, Type: "VPC"}},
		ConnectedOver:       "VPC",
		AgentVersion:        "v1.4.0",
		IstioSidecarVersion: "1.9.8-15bc6e5e32",
		Labels:              map[string]string{"version": "v5"},
	}
}

// ratingsHarness is a harness whose namespace holds the policy (a file)
// and the ratings WorkloadGroup.
func ratingsHarness(t *testing.T, policy string) *harness {
	t.Helper()
	h := newHarness(t)
	h.apply(policy)
	h.group("ratings", map[string]string{"app": "ratings"})
	return h
}

// registered authorizes and registers the instance m at ip, failing the
// test on error.
func (h *harness) registered(m *awstest.IMDS, ip string) (*onboardingv1alpha1.AuthorizeResponse, *onboardingv1alpha1.RegisterResponse) {
	h.t.Helper()
	auth, err := h.authorize("ratings", m)
	if err != nil {
		h.t.Fatal(err)
	}
	reg, err := h.register(auth.GetToken(), ip)
	if err != nil {
		h.t.Fatal(err)
	}
	return auth, reg
}

// TestRegisterFailureCodes pins the gRPC code (and a word of the message) of
// each way a Register can fail after a successful Authorize: the rules the
// registry applies (the WorkloadGroup, the OnboardingPolicies checked again,
// the reuse of a registration by another agent session, fencing) against the
// real API server, and the codes of RenewSidecarToken and Unregister that
// apply the same session rules.
func TestRegisterFailureCodes(t *testing.T) {
	type attempt struct {
		token, sessionKey string
		req               *onboardingv1alpha1.RegisterRequest
	}
	var fenced *istionetworkingv1.WorkloadEntry // by the fencing case
	tests := []struct {
		name     string
		policy   string
		setup    func(t *testing.T, h *harness) attempt
		wantCode codes.Code
		wantMsg  string
		check    func(t *testing.T, h *harness, resp *onboardingv1alpha1.RegisterResponse)
	}{
		{
			name: "WorkloadGroup deleted after Authorize", policy: narrowPolicy,
			setup: func(t *testing.T, h *harness) attempt {
				auth, err := h.authorize("ratings", h.aws.IMDS)
				if err != nil {
					t.Fatal(err)
				}
				wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: h.ns}}
				if err := env.Client.Delete(t.Context(), wg); err != nil {
					t.Fatal(err)
				}
				waitUncached(t, wg)
				return attempt{token: auth.GetToken(), req: registerRequest("172.31.5.254")}
			},
			wantCode: codes.FailedPrecondition, wantMsg: "ratings",
		},
		{
			name: "OnboardingPolicy deleted after Authorize", policy: narrowPolicy,
			setup: func(t *testing.T, h *harness) attempt {
				auth, err := h.authorize("ratings", h.aws.IMDS)
				if err != nil {
					t.Fatal(err)
				}
				if err := env.Client.DeleteAllOf(t.Context(), &authorizationv1alpha1.OnboardingPolicy{}, client.InNamespace(h.ns)); err != nil {
					t.Fatal(err)
				}
				waitPoliciesUncached(t, h.ns)
				return attempt{token: auth.GetToken(), req: registerRequest("172.31.5.254")}
			},
			wantCode: codes.PermissionDenied, wantMsg: "no OnboardingPolicy",
		},
		{
			name: "label overriding the template", policy: narrowPolicy,
			setup: func(t *testing.T, h *harness) attempt {
				auth, err := h.authorize("ratings", h.aws.IMDS)
				if err != nil {
					t.Fatal(err)
				}
				req := registerRequest("172.31.5.254")
				req.Labels = map[string]string{"app": "reviews"}
				return attempt{token: auth.GetToken(), req: req}
			},
			wantCode: codes.InvalidArgument, wantMsg: "labels[app]",
		},
		{
			name: "connected over an address type it does not report", policy: narrowPolicy,
			setup: func(t *testing.T, h *harness) attempt {
				auth, err := h.authorize("ratings", h.aws.IMDS)
				if err != nil {
					t.Fatal(err)
				}
				req := registerRequest("172.31.5.254")
				req.ConnectedOver = "INTERNET"
				return attempt{token: auth.GetToken(), req: req}
			},
			wantCode: codes.InvalidArgument, wantMsg: "INTERNET",
		},
		{
			name: "address the identity does not prove", policy: narrowPolicy,
			setup: func(t *testing.T, h *harness) attempt {
				auth, err := h.authorize("ratings", h.aws.IMDS)
				if err != nil {
					t.Fatal(err)
				}
				return attempt{token: auth.GetToken(), req: registerRequest("10.9.9.9")}
			},
			wantCode: codes.PermissionDenied, wantMsg: "not proven",
		},
		{
			name: "address held by a WorkloadEntry Embark does not manage", policy: narrowPolicy,
			setup: func(t *testing.T, h *harness) attempt {
				// An address of its own: an unmanaged entry blocks its
				// address in every namespace.
				manual := &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "hand-made", Namespace: h.ns}}
				manual.Spec.Address, manual.Spec.Network = "172.31.7.7", "virtual-machines"
				if err := env.Client.Create(t.Context(), manual); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(t.Context()), manual) })
				fixtures.WaitCached(t, cached, manual)
				auth, err := h.authorize("ratings", h.instance(awstest.Instance{Role: "ratings-role", InstanceID: "i-0eeeeeeeeeeeeeee1", PrivateIP: "172.31.7.7"}))
				if err != nil {
					t.Fatal(err)
				}
				return attempt{token: auth.GetToken(), req: registerRequest("172.31.7.7")}
			},
			wantCode: codes.FailedPrecondition, wantMsg: "hand-made",
		},
		{
			name: "registration name held by another identity", policy: narrowPolicy,
			setup: func(t *testing.T, h *harness) attempt {
				auth, reg := h.registered(h.aws.IMDS, "172.31.5.254")
				war := &runtimev1alpha1.WorkloadAutoRegistration{}
				if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: h.ns, Name: reg.GetRegistrationName()}, war); err != nil {
					t.Fatal(err)
				}
				war.Spec.Identity.AWS.EC2.InstanceID = "i-0fedcba9876543210" // as a name collision would look: another instance
				if err := env.Client.Update(t.Context(), war); err != nil {
					t.Fatal(err)
				}
				return attempt{token: auth.GetToken(), sessionKey: reg.GetSessionKey(), req: registerRequest("172.31.5.254")}
			},
			wantCode: codes.FailedPrecondition, wantMsg: "another identity",
		},
		{
			name: "registration being deleted", policy: narrowPolicy,
			setup: func(t *testing.T, h *harness) attempt {
				auth, reg := h.registered(h.aws.IMDS, "172.31.5.254")
				war := &runtimev1alpha1.WorkloadAutoRegistration{}
				key := client.ObjectKey{Namespace: h.ns, Name: reg.GetRegistrationName()}
				if err := env.Client.Get(t.Context(), key, war); err != nil {
					t.Fatal(err)
				}
				war.Finalizers = append(war.Finalizers, "test.embark/hold")
				if err := env.Client.Update(t.Context(), war); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					cur := &runtimev1alpha1.WorkloadAutoRegistration{}
					if err := env.Client.Get(t.Context(), key, cur); err == nil {
						cur.Finalizers = nil
						_ = env.Client.Update(t.Context(), cur)
					}
				})
				if err := env.Client.Delete(t.Context(), war); err != nil {
					t.Fatal(err)
				}
				return attempt{token: auth.GetToken(), sessionKey: reg.GetSessionKey(), req: registerRequest("172.31.5.254")}
			},
			wantCode: codes.Unavailable, wantMsg: "being deleted",
		},
		{
			name: "another agent session without an STS proof", policy: widePolicy,
			setup: func(t *testing.T, h *harness) attempt {
				noRole := h.instance(awstest.Instance{InstanceID: "i-0bbbbbbbbbbbbbbb1", PrivateIP: "10.0.0.10"})
				auth, _ := h.registered(noRole, "10.0.0.10")
				return attempt{token: auth.GetToken(), req: registerRequest("10.0.0.10")}
			},
			wantCode: codes.PermissionDenied, wantMsg: "another agent session",
		},
		{
			name: "another agent session with a wrong session key and no STS proof", policy: widePolicy,
			setup: func(t *testing.T, h *harness) attempt {
				noRole := h.instance(awstest.Instance{InstanceID: "i-0bbbbbbbbbbbbbbb2", PrivateIP: "10.0.0.11"})
				auth, _ := h.registered(noRole, "10.0.0.11")
				return attempt{token: auth.GetToken(), sessionKey: "not-the-key", req: registerRequest("10.0.0.11")}
			},
			wantCode: codes.PermissionDenied, wantMsg: "another agent session",
		},
		{
			name: "the same agent session again", policy: widePolicy,
			setup: func(t *testing.T, h *harness) attempt {
				noRole := h.instance(awstest.Instance{InstanceID: "i-0bbbbbbbbbbbbbbb3", PrivateIP: "10.0.0.12"})
				auth, reg := h.registered(noRole, "10.0.0.12")
				return attempt{token: auth.GetToken(), sessionKey: reg.GetSessionKey(), req: registerRequest("10.0.0.12")}
			},
			wantCode: codes.OK,
		},
		{
			name: "another agent session with an STS proof takes over", policy: narrowPolicy,
			setup: func(t *testing.T, h *harness) attempt {
				auth, _ := h.registered(h.aws.IMDS, "172.31.5.254")
				return attempt{token: auth.GetToken(), req: registerRequest("172.31.5.254")}
			},
			wantCode: codes.OK,
		},
		{
			name: "a proven address fences the older registration holding it", policy: widePolicy,
			setup: func(t *testing.T, h *harness) attempt {
				old := h.instance(awstest.Instance{InstanceID: "i-0ccccccccccccccc1", PrivateIP: "10.0.0.20"})
				_, reg := h.registered(old, "10.0.0.20")
				we := &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: reg.GetRegistrationName()}}
				fixtures.WaitCached(t, cached, we)
				fresh := h.instance(awstest.Instance{InstanceID: "i-0ccccccccccccccc2", PrivateIP: "10.0.0.20"})
				auth, err := h.authorize("ratings", fresh)
				if err != nil {
					t.Fatal(err)
				}
				fenced = we
				return attempt{token: auth.GetToken(), req: registerRequest("10.0.0.20")}
			},
			wantCode: codes.OK,
			check: func(t *testing.T, _ *harness, _ *onboardingv1alpha1.RegisterResponse) {
				fixtures.WaitGone(t, env.Client, fenced)
			},
		},
		{
			name: "an unproven address held by another registration", policy: widePolicy,
			setup: func(t *testing.T, h *harness) attempt {
				h.applyObject(addressPolicy(h.ns, "10.0.1.0/24"))
				holder := h.instance(awstest.Instance{InstanceID: "i-0ddddddddddddddd1", PrivateIP: "10.0.1.5"})
				_, reg := h.registered(holder, "10.0.1.5")
				fixtures.WaitCached(t, cached, &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: reg.GetRegistrationName()}})
				other := h.instance(awstest.Instance{InstanceID: "i-0ddddddddddddddd2", PrivateIP: "10.0.1.6"})
				auth, err := h.authorize("ratings", other)
				if err != nil {
					t.Fatal(err)
				}
				return attempt{token: auth.GetToken(), req: registerRequest("10.0.1.5")}
			},
			wantCode: codes.FailedPrecondition, wantMsg: "never fences",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := ratingsHarness(t, tt.policy)
			a := tt.setup(t, h)
			resp, err := h.client.Register(session(t.Context(), a.token, a.sessionKey), a.req)
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.wantCode)
			}
			if err != nil && !strings.Contains(status.Convert(err).Message(), tt.wantMsg) {
				t.Errorf("message %q does not mention %q", status.Convert(err).Message(), tt.wantMsg)
			}
			if tt.check != nil {
				tt.check(t, h, resp)
			}
		})
	}
}

// TestRenewAndUnregisterSessionCodes pins the codes of RenewSidecarToken and
// Unregister for a registration bound to another agent session.
func TestRenewAndUnregisterSessionCodes(t *testing.T) {
	h := ratingsHarness(t, narrowPolicy)
	auth, reg := h.registered(h.aws.IMDS, "172.31.5.254")
	for _, tt := range []struct {
		name     string
		key      string
		wantCode codes.Code
	}{
		{name: "no session key", key: "", wantCode: codes.PermissionDenied},
		{name: "wrong session key", key: "not-the-key", wantCode: codes.PermissionDenied},
		{name: "the session key", key: reg.GetSessionKey(), wantCode: codes.OK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := session(t.Context(), auth.GetToken(), tt.key)
			if _, err := h.client.RenewSidecarToken(ctx, &onboardingv1alpha1.RenewSidecarTokenRequest{}); status.Code(err) != tt.wantCode {
				t.Errorf("RenewSidecarToken = %v, want %v", err, tt.wantCode)
			}
			if tt.wantCode == codes.OK {
				return
			}
			if _, err := h.client.Unregister(ctx, &onboardingv1alpha1.UnregisterRequest{}); status.Code(err) != tt.wantCode || !strings.Contains(err.Error(), "another agent session") {
				t.Errorf("Unregister = %v, want %v", err, tt.wantCode)
			}
		})
	}
}

// addressPolicy allows any EC2 instance of the test account to register an
// address of cidr that its identity does not prove.
func addressPolicy(ns, cidr string) *authorizationv1alpha1.OnboardingPolicy {
	return &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "addresses", Namespace: ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads:    []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{"123456789012"}, EC2: &authorizationv1alpha1.EC2Matcher{}}}},
			OnboardTo:    []authorizationv1alpha1.OnboardTarget{{}},
			AddressCIDRs: []authorizationv1alpha1.CIDR{authorizationv1alpha1.CIDR(cidr)},
		}}},
	}
}

// applyObject creates a policy and waits until the cache has it.
func (h *harness) applyObject(obj *authorizationv1alpha1.OnboardingPolicy) {
	h.t.Helper()
	if err := env.Client.Create(h.t.Context(), obj); err != nil {
		h.t.Fatal(err)
	}
	fixtures.WaitCached(h.t, cached, obj)
}

// waitUncached waits until the endpoint's cache no longer has obj.
func waitUncached(t *testing.T, obj client.Object) {
	t.Helper()
	fixtures.Eventually(t, 30*time.Second, "cache drops "+obj.GetName(), func() bool {
		return apierrors.IsNotFound(cached.Get(t.Context(), client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object)))
	})
}

// waitPoliciesUncached waits until the endpoint's cache holds no
// OnboardingPolicy of ns.
func waitPoliciesUncached(t *testing.T, ns string) {
	t.Helper()
	fixtures.Eventually(t, 30*time.Second, "cache drops the policies of "+ns, func() bool {
		list := &authorizationv1alpha1.OnboardingPolicyList{}
		return cached.List(t.Context(), list, client.InNamespace(ns)) == nil && len(list.Items) == 0
	})
}
