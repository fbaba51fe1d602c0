package awstest

import (
	"testing"
)

// Env is a CA, an STS and the IMDS of one instance, wired together.
type Env struct {
	CA   *CA
	STS  *STS
	IMDS *IMDS
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
	imds, err := NewIMDS(ca, inst, WithRoleCredentialsFrom(sts))
	if err != nil {
		tb.Fatalf("awstest: %v", err)
	}
	tb.Cleanup(imds.Close)
	return &Env{CA: ca, STS: sts, IMDS: imds}
}

// AddInstance starts another instance's IMDS sharing the Env's CA (if the
// instance is in the CA's region; pass another CA otherwise) and STS.
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
	return imds
}
