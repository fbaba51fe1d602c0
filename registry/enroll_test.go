package registry

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
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
		{name: "same GCE instance", a: gceIdentity("embark-test", "5180367924151823417"), b: gceIdentity("embark-test", "5180367924151823417"), wantSame: true, wantFresh: true},
		{name: "GCE instance ID in another project", a: gceIdentity("embark-test", "5180367924151823417"), b: gceIdentity("other-project", "5180367924151823417"), wantFresh: true},
		{name: "another GCE instance", a: gceIdentity("embark-test", "5180367924151823417"), b: gceIdentity("embark-test", "1"), wantFresh: true},
		{name: "same Azure VM", a: azureIdentity("embark-rg", "ratings-1"), b: azureIdentity("embark-rg", "ratings-1"), wantSame: true, wantFresh: true},
		{name: "Azure VM of that name in another resource group", a: azureIdentity("embark-rg", "ratings-1"), b: azureIdentity("other-rg", "ratings-1"), wantFresh: true},
		{name: "another Azure VM", a: azureIdentity("embark-rg", "ratings-1"), b: azureIdentity("embark-rg", "ratings-2"), wantFresh: true},
		{name: "GCE instance and Azure VM", a: gceIdentity("embark-test", "5180367924151823417"), b: azureIdentity("embark-rg", "ratings-1"), wantFresh: true},
		{name: "same ECS task", a: ecsIdentity("123456789012", "prod", "abc"), b: ecsIdentity("123456789012", "prod", "abc"), wantSame: true, wantFresh: true},
		{name: "ECS task ID in another cluster", a: ecsIdentity("123456789012", "prod", "abc"), b: ecsIdentity("123456789012", "dev", "abc"), wantFresh: true},
		{name: "ECS task ID in another account", a: ecsIdentity("123456789012", "prod", "abc"), b: ecsIdentity("999999999999", "prod", "abc"), wantFresh: true},
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

// cidrPolicy is a Policy whose rules allow every workload and list cidrs in
// their addressCIDRs.
type cidrPolicy []netip.Prefix

func (cidrPolicy) Allow(context.Context, string, string, runtimev1alpha1.WorkloadIdentity) error {
	return nil
}

func (p cidrPolicy) AllowsAddress(_ context.Context, _, _ string, _ runtimev1alpha1.WorkloadIdentity, addr netip.Addr) (bool, error) {
	return slices.ContainsFunc(p, func(c netip.Prefix) bool { return c.Contains(addr) }), nil
}

func TestProveAddresses(t *testing.T) {
	ec2 := fixtures.AWSIdentity("i-1234567890abcdef0")
	confirmedECS := ecsIdentity("123456789012", "prod", "abc")
	confirmedECS.ECS.TaskConfirmed = true
	gceInstance := func(confirmed bool) runtimev1alpha1.WorkloadIdentity {
		return runtimev1alpha1.WorkloadIdentity{GCP: &runtimev1alpha1.GCPIdentity{ProjectID: "embark-test", ProjectNumber: "1", Zone: "us-central1-a",
			InstanceID: "5180367924151823417", InstanceName: "ratings-1", ServiceAccount: "sa@embark-test.iam.gserviceaccount.com", InstanceConfirmed: confirmed}}
	}
	host := func(connectedOver runtimev1alpha1.AddressType, addrs ...runtimev1alpha1.HostAddress) runtimev1alpha1.Registration {
		return runtimev1alpha1.Registration{Host: runtimev1alpha1.HostInfo{Addresses: addrs}, Settings: runtimev1alpha1.Settings{ConnectedOver: connectedOver}}
	}
	vpc := func(ip string) runtimev1alpha1.HostAddress {
		return runtimev1alpha1.HostAddress{IP: ip, Type: runtimev1alpha1.AddressTypeVPC}
	}
	internet := func(ip string) runtimev1alpha1.HostAddress {
		return runtimev1alpha1.HostAddress{IP: ip, Type: runtimev1alpha1.AddressTypeInternet}
	}
	tests := []struct {
		name        string
		id          runtimev1alpha1.WorkloadIdentity
		proven      string // Enrollment.ProvenAddress
		reg         runtimev1alpha1.Registration
		policy      cidrPolicy
		wantProven  bool
		wantRefused string // the field named in ErrAddressNotProven; "" accepted
	}{
		{name: "the document's privateIp", id: ec2, proven: "10.0.0.5", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.0.5")), wantProven: true},
		{name: "connectedOver defaults to VPC", id: ec2, proven: "10.0.0.5", reg: host("", vpc("10.0.0.5")), wantProven: true},
		{name: "another VPC address", id: ec2, proven: "10.0.0.5", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.9.9.9")), wantRefused: "registration.host.addresses[0].ip"},
		{name: "the privateIp claimed as INTERNET", id: ec2, proven: "10.0.0.5", reg: host(runtimev1alpha1.AddressTypeInternet, internet("10.0.0.5")), wantRefused: "registration.host.addresses[0].ip"},
		{name: "an extra unproven address", id: ec2, proven: "10.0.0.5", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.0.5"), internet("10.9.9.9")), wantRefused: "registration.host.addresses[1].ip"},
		{name: "an extra address in addressCIDRs", id: ec2, proven: "10.0.0.5", policy: cidrPolicy{netip.MustParsePrefix("10.9.9.0/24")},
			reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.0.5"), internet("10.9.9.9")), wantProven: true},
		{name: "connected over an address in addressCIDRs", id: ec2, proven: "10.0.0.5", policy: cidrPolicy{netip.MustParsePrefix("203.0.113.0/24")},
			reg: host(runtimev1alpha1.AddressTypeInternet, vpc("10.0.0.5"), internet("203.0.113.7"))},
		{name: "the workload address proven, a second of its type not", id: ec2, proven: "10.0.0.5", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.0.5"), vpc("10.0.0.6")), wantRefused: "registration.host.addresses[1].ip"},
		{name: "a JWT host in addressCIDRs", id: jwtIdentity("https://idp", "vm-1"), policy: cidrPolicy{netip.MustParsePrefix("10.0.0.0/8")},
			reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.0.5"))},
		{name: "a JWT host outside addressCIDRs", id: jwtIdentity("https://idp", "vm-1"), policy: cidrPolicy{netip.MustParsePrefix("10.0.0.0/8")},
			reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.0.5"), internet("198.51.100.1")), wantRefused: "registration.host.addresses[1].ip"},
		{name: "a confirmed ECS task's ENI address", id: confirmedECS, proven: "10.0.3.17", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.3.17")), wantProven: true},
		{name: "another address of a confirmed ECS task", id: confirmedECS, proven: "10.0.3.17", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.3.18")), wantRefused: "registration.host.addresses[0].ip"},
		{name: "an unconfirmed ECS task proves no address", id: ecsIdentity("123456789012", "prod", "abc"), proven: "10.0.3.17", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.3.17")), wantRefused: "registration.host.addresses[0].ip"},
		{name: "an unconfirmed ECS task in addressCIDRs", id: ecsIdentity("123456789012", "prod", "abc"), policy: cidrPolicy{netip.MustParsePrefix("10.0.3.0/24")},
			reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.0.3.17"))},
		{name: "a confirmed GCE instance's nic0 address", id: gceInstance(true), proven: "10.128.0.7", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.128.0.7")), wantProven: true},
		{name: "another address of a confirmed GCE instance", id: gceInstance(true), proven: "10.128.0.7", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.128.0.8")), wantRefused: "registration.host.addresses[0].ip"},
		{name: "a confirmed GCE instance's nic0 address claimed as INTERNET", id: gceInstance(true), proven: "10.128.0.7", reg: host(runtimev1alpha1.AddressTypeInternet, internet("10.128.0.7")), wantRefused: "registration.host.addresses[0].ip"},
		{name: "an unconfirmed GCE instance proves no address", id: gceInstance(false), proven: "10.128.0.7", reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.128.0.7")), wantRefused: "registration.host.addresses[0].ip"},
		{name: "an unconfirmed GCE instance in addressCIDRs", id: gceInstance(false), policy: cidrPolicy{netip.MustParsePrefix("10.128.0.0/20")},
			reg: host(runtimev1alpha1.AddressTypeVPC, vpc("10.128.0.7"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := Enrollment{Namespace: "bookinfo", Group: "ratings", Identity: tt.id, ProvenAddress: tt.proven, Registration: tt.reg}
			proven, err := proveAddresses(t.Context(), e, tt.policy)
			switch {
			case tt.wantRefused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.wantRefused != "" && (!errors.Is(err, ErrAddressNotProven) || !strings.Contains(err.Error(), tt.wantRefused)):
				t.Fatalf("err = %v, want ErrAddressNotProven naming %s", err, tt.wantRefused)
			case err == nil && proven != tt.wantProven:
				t.Errorf("workload address proven by the identity = %v, want %v", proven, tt.wantProven)
			}
		})
	}
}

func gceIdentity(project, instanceID string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{GCP: &runtimev1alpha1.GCPIdentity{
		ProjectID: project, ProjectNumber: "123456789012", Zone: "us-central1-a", InstanceID: instanceID,
		InstanceName: "ratings-1", ServiceAccount: "ratings@" + project + ".iam.gserviceaccount.com",
	}}
}

func azureIdentity(group, name string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{Azure: &runtimev1alpha1.AzureIdentity{
		TenantID: "72f988bf-86f1-41af-91ab-2d7cd011db47", SubscriptionID: "0b1f6471-1bf0-4dda-aec3-cb9272f09590",
		ResourceGroup: group, VMName: name, PrincipalID: "9b5a7f2e-3c1d-4e8f-a6b2-0d4c8e1f7a93",
	}}
}

func ecsIdentity(account, cluster, taskID string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{ECS: &runtimev1alpha1.ECSIdentity{
		Partition: "aws", Account: account, Region: "us-east-2", Zone: "us-east-2b", Cluster: cluster,
		TaskARN: "arn:aws:ecs:us-east-2:" + account + ":task/" + cluster + "/" + taskID, TaskID: taskID, TaskRole: "ratings-task",
	}}
}
