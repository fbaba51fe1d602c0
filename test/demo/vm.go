package main

import (
	"context"
	"fmt"
	"os/exec"
	"sync"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"google.golang.org/grpc/metadata"
	"k8s.io/apimachinery/pkg/types"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/vmsim"
)

// vm is one simulated EC2 instance: its IMDS on loopback, the application's
// HTTP server, and, once onboarded, Istio's pilot-agent as its sidecar.
type vm struct {
	name string // the demo's name for it, e.g. ratings-1
	imds *awstest.IMDS

	app *vmsim.App

	// root is the VM's root directory: its onboarding agent's configuration
	// and log, the sidecar files the agent writes, pilot-agent's working
	// directory.
	root      string
	settings  agentSettings
	unit      *vmsim.Unit
	agent     *exec.Cmd
	agentDone chan error
	uid       types.UID // a registration it must no longer be (re-onboarding)

	mu           sync.Mutex // guards the fields below (the unit runs commands concurrently with the steps)
	registration string     // name of its WorkloadAutoRegistration, from the sidecar's bootstrap
	restarts     int        // sidecar restarts by the onboarding agent
	sidecar      *istioagent.Agent
	envoy        *istioagent.Client
	stopEnvoy    context.CancelFunc
}

// reg returns the name of the VM's registration.
func (v *vm) reg() string {
	name, _ := v.state()
	return name
}

// state returns the VM's registration name and its sidecar restarts so far.
func (v *vm) state() (string, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.registration, v.restarts
}

// startApp starts the VM's application on the VM's private IP (a loopback
// address) and port.
func (v *vm) startApp(port int) error {
	app, err := vmsim.StartApp(v.imds.Instance().PrivateIP, port, "ratings on "+v.name)
	if err != nil {
		return fmt.Errorf("%s: %w", v.name, err)
	}
	v.app = app
	return nil
}

// onboard does, once, what the onboarding agent on the VM does: read the platform
// credential from IMDS (document, signature, a signed STS request), get an
// onboarding token (Authorize) and register (Register).
func (v *vm) onboard(ctx context.Context, api onboardingv1alpha1.OnboardingServiceClient, stsURL string) (*onboardingv1alpha1.RegisterResponse, error) {
	ic := imds.New(imds.Options{Endpoint: v.imds.URL})
	sc := awsclient.NewSTSClient(ic, v.imds.Instance().Region, func(o *sts.Options) { o.BaseEndpoint = &stsURL })
	cred, err := awsclient.Credential(ctx, ic, sc, endpointHost)
	if err != nil {
		return nil, fmt.Errorf("read the platform credential: %w", err)
	}
	auth, err := api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: "bookinfo", Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: awswire.ToProto(cred)},
	})
	if err != nil {
		return nil, err
	}
	return api.Register(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
		Addresses:           []*onboardingv1alpha1.HostAddress{{Ip: v.imds.Instance().PrivateIP, Type: "VPC"}},
		ConnectedOver:       "VPC",
		AgentVersion:        "v0.1.0-demo",
		IstioSidecarVersion: "1.30-dev",
		Labels:              map[string]string{"version": "v5"},
	})
}

// connectEnvoy opens the stream Envoy would open on pilot-agent's XDS
// socket and plays Envoy's part on it (playEnvoy) until the stream ends.
func (v *vm) connectEnvoy(ctx context.Context) error {
	ectx, cancel := context.WithCancel(ctx)
	v.mu.Lock()
	sidecar := v.sidecar
	v.mu.Unlock()
	c, err := istioagent.Connect(ectx, sidecar)
	if err != nil {
		cancel()
		return err
	}
	v.mu.Lock()
	v.envoy, v.stopEnvoy = c, cancel
	v.mu.Unlock()
	go func() { _ = playEnvoy(ectx, c) }()
	return nil
}

// stopSidecar stops pilot-agent, as when the VM's sidecar is stopped or the
// VM goes away.
func (v *vm) stopSidecar() {
	v.mu.Lock()
	stopEnvoy, envoy, sidecar := v.stopEnvoy, v.envoy, v.sidecar
	v.stopEnvoy, v.envoy = nil, nil
	v.mu.Unlock()
	if stopEnvoy != nil {
		stopEnvoy()
		_ = envoy.Close()
	}
	if sidecar != nil {
		sidecar.Stop()
	}
}

// close stops the VM's application (its IMDS belongs to simulatedAWS).
func (v *vm) close() {
	if v.app != nil {
		v.app.Close()
	}
}
