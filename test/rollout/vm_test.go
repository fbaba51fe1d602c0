package rollout

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/vmsim"
)

// fleetVM is one of the fleet's simulated EC2 instances: test/demo/vm's VM
// (its IMDS, its application on its own loopback address whose /ready the
// group's probe checks, its sidecar unit running pilot-agent), with its
// onboarding agent (the real library) in this process.
type fleetVM struct {
	*vm.VM
	// breakOnRestart makes the next sidecar restarts (a re-onboarding: the
	// application's new version) unhealthy.
	breakOnRestart atomic.Bool
}

// fleetSettings are what every VM's onboarding agent is told.
type fleetSettings struct {
	endpoint string // onboarding API address
	caFile   string // the endpoint's CA
	stsURL   string
	appPort  int
	ns       string // the WorkloadGroup's namespace
}

// newFleetVM returns the i-th VM (from 0), its IMDS serving an instance
// of ca's region whose role credentials come from sts.
func newFleetVM(t *testing.T, i int, ca *awstest.CA, sts *awstest.STS) *fleetVM {
	t.Helper()
	ip := fmt.Sprintf("127.0.2.%d", i+1)
	imds, err := awstest.NewIMDS(ca, awstest.Instance{Role: "ratings-role", PrivateIP: ip, InstanceID: fmt.Sprintf("i-0a%015d", i+1)}, awstest.WithRoleCredentialsFrom(sts))
	must(t, err)
	t.Cleanup(imds.Close)
	return &fleetVM{VM: &vm.VM{Name: fmt.Sprintf("vm-%02d", i+1), IMDS: imds}}
}

// start starts the VM's application, its sidecar unit and its onboarding
// agent; note logs the VM's application turning unhealthy.
func (v *fleetVM) start(t *testing.T, s fleetSettings, note func(format string, args ...any)) {
	t.Helper()
	var err error
	// Not t.TempDir(): unix socket paths are limited to 107 bytes.
	v.Root, err = os.MkdirTemp("", "wgr-"+v.Name+"-")
	must(t, err)
	must(t, v.StartApp(v.IP(), s.appPort))
	v.BeforeRestart = func() {
		if v.breakOnRestart.Load() {
			v.App.SetHealthy(false)
			note("%s: its application's new version fails /ready", v.Name)
		}
	}
	exe, err := os.Executable()
	must(t, err)
	must(t, v.StartAgent(vmsim.FatalTB{TB: t}, vm.Settings{Exe: exe, Endpoint: s.endpoint, ServerName: endpointHost, CAFile: s.caFile,
		Host: v.AWSHost(s.stsURL), Namespace: s.ns, IstioVersion: "1.30.0",
		InProcess: &vm.InProcess{Version: "v0.0.0-rollout-test", MinBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second}}))
}

// shutdown stops the onboarding agent gracefully (it unregisters and stops
// the sidecar through the unit), then the unit and the application, and
// removes the VM's root.
func (v *fleetVM) shutdown() {
	if v.Root != "" {
		defer func() { _ = os.RemoveAll(v.Root) }()
	}
	v.Shutdown()
	v.Close()
}

func (v *fleetVM) sidecarRestarts() int {
	_, n := v.State()
	return n
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
