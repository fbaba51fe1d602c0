package registry

import (
	"testing"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

func TestLocality(t *testing.T) {
	tests := []struct {
		name string
		id   runtimev1alpha1.WorkloadIdentity
		want string
	}{
		{name: "ec2", id: runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{Region: "us-east-2", Zone: "us-east-2b"}}, want: "us-east-2/us-east-2b"},
		{name: "gce: the zone's region", id: runtimev1alpha1.WorkloadIdentity{GCP: &runtimev1alpha1.GCPIdentity{Zone: "us-central1-a"}}, want: "us-central1/us-central1-a"},
		{name: "gce zone without a region", id: runtimev1alpha1.WorkloadIdentity{GCP: &runtimev1alpha1.GCPIdentity{Zone: "zone"}}, want: ""},
		{name: "ecs", id: ecsIdentity("123456789012", "prod", "abc"), want: "us-east-2/us-east-2b"},
		{name: "azure confirmed by Resource Manager: its location", id: runtimev1alpha1.WorkloadIdentity{Azure: &runtimev1alpha1.AzureIdentity{VMName: "vm-1", Location: "westeurope", VMConfirmed: true}}, want: "westeurope"},
		{name: "azure not confirmed", id: runtimev1alpha1.WorkloadIdentity{Azure: &runtimev1alpha1.AzureIdentity{VMName: "vm-1"}}, want: ""},
		{name: "jwt", id: runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Subject: "vm-1"}}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := locality(tt.id); got != tt.want {
				t.Errorf("locality = %q, want %q", got, tt.want)
			}
		})
	}
}
