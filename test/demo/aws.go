package main

import "github.com/embark-mesh/embark/onboarding/identity/aws/awstest"

// simulatedAWS is one AWS region on loopback: its demo certificate, STS,
// EC2/IAM (for the endpoint's instance profile check), and the IMDS of each
// instance.
type simulatedAWS struct {
	ca     *awstest.CA
	sts    *awstest.STS
	ec2iam *awstest.EC2IAM
	imds   []*awstest.IMDS
	// account is the account the simulated EC2/IAM answers for: the first
	// instance's. Its one set of credentials cannot tell accounts apart,
	// so it refuses a profile name two accounts' profiles share.
	account string
}

// instance starts inst's IMDS and, when it has a role, gives it the
// instance profile of that role in EC2/IAM, as launching it with the
// profile does.
func (a *simulatedAWS) instance(inst awstest.Instance) (*awstest.IMDS, error) {
	m, err := awstest.NewIMDS(a.ca, inst, awstest.WithRoleCredentialsFrom(a.sts))
	if err != nil {
		return nil, err
	}
	a.imds = append(a.imds, m)
	in := m.Instance()
	if a.account == "" {
		a.account = in.Account
	}
	// An instance of another account (refused by policy before any
	// EC2/IAM call) has its instance profile in that account, not here.
	if in.Role != "" && in.Account == a.account {
		arn := awstest.InstanceProfileARN(in)
		a.ec2iam.SetProfile(arn, in.Role)
		a.ec2iam.Associate(in.InstanceID, arn)
	}
	return m, nil
}

func (a *simulatedAWS) close() {
	for _, m := range a.imds {
		m.Close()
	}
	a.imds = nil
	if a.sts != nil {
		a.sts.Close()
		a.sts = nil
	}
	if a.ec2iam != nil {
		a.ec2iam.Close()
		a.ec2iam = nil
	}
}
