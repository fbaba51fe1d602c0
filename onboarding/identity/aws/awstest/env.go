package awstest

import (
	"fmt"
	"testing"
)

// Env is a CA, an STS, the IMDS of one instance, and EC2/IAM, wired
// together.
type Env struct {
	CA   *CA
	STS  *STS
	IMDS *IMDS
	// EC2IAM is EC2 and IAM of the Env's account (the first instance's),
	// as the endpoint's own credentials reach them: every instance of
	// that account that has a role has the instance profile
	// instance-profile/<role> (the ARN its IMDS reports) carrying that
	// role, as launching an instance with a profile does.
	EC2IAM *EC2IAM

	account string
}

// Start creates an Env for inst (defaults filled in; the CA is for
// inst.Region) and closes its servers when tb ends. The instance's role
// credentials, if it has a Role, come from the Env's STS.
func Start(tb testing.TB, inst Instance) *Env {
	tb.Helper()
	inst = inst.withDefaults()
	ca, err := NewCA(inst.Region)
	if err != nil {
		tb.Fatalf("awstest: %v", err)
	}
	sts := NewSTS()
	tb.Cleanup(sts.Close)
	ec2iam := NewEC2IAM()
	tb.Cleanup(ec2iam.Close)
	e := &Env{CA: ca, STS: sts, EC2IAM: ec2iam, account: inst.Account}
	e.IMDS = e.AddInstance(tb, ca, inst)
	return e
}

// AddInstance starts another instance's IMDS sharing the Env's CA (if the
// instance is in the CA's region; pass another CA otherwise) and STS, and
// associates its instance profile in EC2IAM when it has a role and is of
// the Env's account.
func (e *Env) AddInstance(tb testing.TB, ca *CA, inst Instance) *IMDS {
	tb.Helper()
	if ca == nil {
		ca = e.CA
	}
	imds, err := NewIMDS(ca, inst, WithRoleCredentialsFrom(e.STS))
	if err != nil {
		tb.Fatalf("awstest: %v", err)
	}
	tb.Cleanup(imds.Close)
	if in := imds.Instance(); in.Role != "" && in.Account == e.account && e.EC2IAM != nil {
		arn := InstanceProfileARN(in)
		e.EC2IAM.SetProfile(arn, in.Role)
		e.EC2IAM.Associate(in.InstanceID, arn)
	}
	return imds
}

// InstanceProfileARN is the ARN of the instance profile named after the
// instance's role, as its IMDS reports it.
func InstanceProfileARN(inst Instance) string {
	return fmt.Sprintf("arn:%s:iam::%s:instance-profile/%s", inst.Partition(), inst.Account, inst.Role)
}
