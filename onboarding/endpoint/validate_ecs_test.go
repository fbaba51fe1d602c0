package endpoint

import (
	"strings"
	"testing"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

func TestValidateAuthorizeRequestECS(t *testing.T) {
	valid := func() *onboardingv1alpha1.ECSCredential {
		return &onboardingv1alpha1.ECSCredential{
			StsGetCallerIdentity: &onboardingv1alpha1.SignedHTTPRequest{Method: "POST", Url: "https://sts.us-east-2.amazonaws.com/"},
			Cluster:              "prod", TaskArn: "arn:aws:ecs:us-east-2:123456789012:task/prod/abc", AvailabilityZone: "us-east-2b",
		}
	}
	tests := []struct {
		name    string
		edit    func(*onboardingv1alpha1.ECSCredential)
		wantErr string
	}{
		{name: "valid", edit: func(*onboardingv1alpha1.ECSCredential) {}},
		{name: "no STS request", edit: func(c *onboardingv1alpha1.ECSCredential) { c.StsGetCallerIdentity = nil }, wantErr: "ecs.sts_get_caller_identity: required"},
		{name: "STS request not POST", edit: func(c *onboardingv1alpha1.ECSCredential) { c.StsGetCallerIdentity.Method = "GET" }, wantErr: "ecs.sts_get_caller_identity.method"},
		{name: "STS request to no URL", edit: func(c *onboardingv1alpha1.ECSCredential) { c.StsGetCallerIdentity.Url = "sts" }, wantErr: "ecs.sts_get_caller_identity.url"},
		{name: "no task ARN", edit: func(c *onboardingv1alpha1.ECSCredential) { c.TaskArn = "" }, wantErr: "ecs.task_arn"},
		{name: "no cluster", edit: func(c *onboardingv1alpha1.ECSCredential) { c.Cluster = "" }, wantErr: "ecs.cluster"},
		{name: "zone too long", edit: func(c *onboardingv1alpha1.ECSCredential) { c.AvailabilityZone = strings.Repeat("a", 49) }, wantErr: "ecs.availability_zone"},
		{name: "task ARN not UTF-8", edit: func(c *onboardingv1alpha1.ECSCredential) { c.TaskArn = "\xff" }, wantErr: "ecs.task_arn"},
		{name: "address too long", edit: func(c *onboardingv1alpha1.ECSCredential) { c.Address = strings.Repeat("1", 65) }, wantErr: "ecs.address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.edit(c)
			err := ValidateAuthorizeRequest(&onboardingv1alpha1.AuthorizeRequest{
				WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: "bookinfo", Name: "ratings"},
				Credential:    &onboardingv1alpha1.AuthorizeRequest_Ecs{Ecs: c},
			})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
}
