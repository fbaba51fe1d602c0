package registry

import (
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

func jwtIdentity(issuer, subject string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Issuer: issuer, Subject: subject}}
}

func withRole(id runtimev1alpha1.WorkloadIdentity, role string) runtimev1alpha1.WorkloadIdentity {
	a := *id.AWS
	ec2 := *a.EC2
	ec2.IAMRole = role
	a.EC2 = &ec2
	return runtimev1alpha1.WorkloadIdentity{AWS: &a}
}

func TestSameWorkloadAndFreshProof(t *testing.T) {
	inst := fixtures.AWSIdentity("i-1234567890abcdef0")
	otherRegion := fixtures.AWSIdentity("i-1234567890abcdef0")
	otherRegion.AWS.Region = "us-west-2"
	tests := []struct {
		name      string
		a, b      runtimev1alpha1.WorkloadIdentity
		wantSame  bool
		wantFresh bool // FreshProof(b)
	}{
		{name: "same instance, document only", a: inst, b: inst, wantSame: true},
		{name: "same instance, STS proof", a: inst, b: withRole(inst, "ratings-role"), wantSame: true, wantFresh: true},
		{name: "region is not compared", a: inst, b: otherRegion, wantSame: true},
		{name: "another instance", a: inst, b: fixtures.AWSIdentity("i-0000000000000000a")},
		{name: "same JWT subject", a: jwtIdentity("https://idp", "vm-1"), b: jwtIdentity("https://idp", "vm-1"), wantSame: true, wantFresh: true},
		{name: "another JWT subject", a: jwtIdentity("https://idp", "vm-1"), b: jwtIdentity("https://idp", "vm-2"), wantFresh: true},
		{name: "AWS and JWT", a: inst, b: jwtIdentity("https://idp", "vm-1"), wantFresh: true},
		{name: "no identity", a: inst, b: runtimev1alpha1.WorkloadIdentity{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SameWorkload(tt.a, tt.b); got != tt.wantSame {
				t.Errorf("SameWorkload = %v, want %v", got, tt.wantSame)
			}
			if got := FreshProof(tt.b); got != tt.wantFresh {
				t.Errorf("FreshProof = %v, want %v", got, tt.wantFresh)
			}
		})
	}
}

func TestCheckHolder(t *testing.T) {
	war := &runtimev1alpha1.WorkloadAutoRegistration{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bookinfo", Name: seedName, Annotations: map[string]string{AnnotationSessionHash: SessionHash("key-1")}},
		Spec:       runtimev1alpha1.WorkloadAutoRegistrationSpec{Identity: fixtures.AWSIdentity("i-1234567890abcdef0")},
	}
	unbound := war.DeepCopy()
	unbound.Annotations = nil
	tests := []struct {
		name    string
		war     *runtimev1alpha1.WorkloadAutoRegistration
		id      runtimev1alpha1.WorkloadIdentity
		key     string
		wantErr error
	}{
		{name: "the holder", war: war, id: fixtures.AWSIdentity("i-1234567890abcdef0"), key: "key-1"},
		{name: "another workload", war: war, id: fixtures.AWSIdentity("i-0000000000000000a"), key: "key-1", wantErr: ErrOtherWorkload},
		{name: "no session key", war: war, id: fixtures.AWSIdentity("i-1234567890abcdef0"), wantErr: ErrWrongSession},
		{name: "another session key", war: war, id: fixtures.AWSIdentity("i-1234567890abcdef0"), key: "key-2", wantErr: ErrWrongSession},
		{name: "a registration bound to no session", war: unbound, id: fixtures.AWSIdentity("i-1234567890abcdef0"), key: "key-1", wantErr: ErrWrongSession},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckHolder(tt.war, tt.id, tt.key)
			if (tt.wantErr == nil) != (err == nil) || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Errorf("CheckHolder = %v, want %v", err, tt.wantErr)
			}
		})
	}
}
