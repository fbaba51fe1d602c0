package main

import "github.com/embark-mesh/embark/onboarding/identity/aws/awstest"

// simulatedAWS is one AWS region on loopback: its demo certificate, STS, and
// the IMDS of each instance.
type simulatedAWS struct {
	ca   *awstest.CA
	sts  *awstest.STS
	imds []*awstest.IMDS
}

func (a *simulatedAWS) instance(inst awstest.Instance) (*awstest.IMDS, error) {
	m, err := awstest.NewIMDS(a.ca, inst, awstest.WithRoleCredentialsFrom(a.sts))
	if err != nil {
		return nil, err
	}
	a.imds = append(a.imds, m)
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
}
