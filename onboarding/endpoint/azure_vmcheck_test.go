package endpoint

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/azure"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	"github.com/embark-mesh/embark/test/fixtures"
)

// Resource Manager failing or refusing the endpoint (500, 403) is not a
// refusal of the VM: Authorize answers UNAVAILABLE (the agent retries), and
// the same token (IMDS hands it out again) onboards once Resource Manager
// answers. A VM Resource Manager does not know is UNAUTHENTICATED.
func TestAzureVMCheckUnavailableIsRetryable(t *testing.T) {
	for _, tt := range []struct {
		name     string
		arrange  func(a *azuretest.ARM, vm azuretest.VM)
		wantCode codes.Code
		wantMsg  string
		retryOK  bool
	}{
		{name: "Resource Manager failing (500)", arrange: func(a *azuretest.ARM, _ azuretest.VM) { a.SetStatus(http.StatusInternalServerError) },
			wantCode: codes.Unavailable, wantMsg: "VMCheckUnavailable", retryOK: true},
		{name: "endpoint without its role (403)", arrange: func(a *azuretest.ARM, _ azuretest.VM) { a.SetStatus(http.StatusForbidden) },
			wantCode: codes.Unavailable, wantMsg: "HTTP 403", retryOK: true},
		{name: "VM unknown", arrange: func(a *azuretest.ARM, vm azuretest.VM) { a.RemoveVM(vm) },
			wantCode: codes.Unauthenticated, wantMsg: "VMNotFound"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ms, err := azuretest.NewMicrosoft()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(ms.Close)
			arm := azuretest.NewARM()
			t.Cleanup(arm.Close)
			vm := azuretest.DefaultVM()
			arm.AddVM(vm)
			src, err := azure.NewTokenSource(azure.TokenSourceOptions{Getenv: func(string) string { return "" }, IMDSEndpoint: arm.URL()})
			if err != nil {
				t.Fatal(err)
			}
			checker, err := azure.NewChecker(azure.CheckerOptions{Token: src, ARMEndpoint: arm.URL()})
			if err != nil {
				t.Fatal(err)
			}
			v, err := azure.NewVerifier(azure.Config{Tenants: []string{vm.TenantID}, Audiences: []string{audience}, JWKSURL: ms.JWKSURL(), CACertificates: ms.CACertificates(),
				VMCheck: checker})
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, func(o *Options) { o.Azure = v })
			p := &authorizationv1alpha1.OnboardingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "azure", Namespace: h.ns},
				Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
					Workloads: []authorizationv1alpha1.WorkloadMatcher{{Azure: &authorizationv1alpha1.AzureMatcher{
						Tenants: []string{vm.TenantID}, Subscriptions: []string{vm.SubscriptionID},
					}}},
					OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
				}}}}
			if err := env.Client.Create(t.Context(), p); err != nil {
				t.Fatal(err)
			}
			fixtures.WaitCached(t, cached, p)
			h.group("ratings", map[string]string{"app": "ratings"})
			tok, err := ms.Token(vm, audience, time.Now().Add(-time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			req := &onboardingv1alpha1.AuthorizeRequest{
				WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: "ratings"},
				Credential:    &onboardingv1alpha1.AuthorizeRequest_Azure{Azure: &onboardingv1alpha1.AzureCredential{Token: tok}},
			}
			tt.arrange(arm, vm)
			_, err = h.client.Authorize(t.Context(), req)
			if status.Code(err) != tt.wantCode || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("Authorize = %v, want %s mentioning %q", err, tt.wantCode, tt.wantMsg)
			}
			if !tt.retryOK {
				return
			}
			arm.SetStatus(0)
			if _, err := h.client.Authorize(t.Context(), req); err != nil {
				t.Errorf("the same token once Resource Manager answers: %v", err)
			}
		})
	}
}
