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
	if in := m.Instance(); in.Role != "" {
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
