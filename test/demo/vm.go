package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	meshconfig "istio.io/api/mesh/v1alpha1"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/test/istioagent"
)

// vm is one simulated EC2 instance: its IMDS on loopback, the application's
// HTTP server, and, once onboarded, Istio's pilot-agent as its sidecar.
type vm struct {
	name string // the demo's name for it, e.g. ratings-1
	imds *awstest.IMDS

	app     *http.Server
	appAddr string
	healthy atomic.Bool

	registration string // name of its WorkloadAutoRegistration, once onboarded
	bootstrap    *onboardingv1alpha1.SidecarBootstrap
	sidecar      *istioagent.Agent
	envoy        *istioagent.Client
	stopEnvoy    context.CancelFunc
}

// startApp starts the VM's application: an HTTP server on the VM's private
// IP (a loopback address) and port whose /ready answers 200 while the VM is
// healthy and 503 otherwise.
func (v *vm) startApp(port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort(v.imds.Instance().PrivateIP, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("listen for %s's application: %w", v.name, err)
	}
	v.healthy.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !v.healthy.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "ratings on %s\n", v.name) })
	v.app = &http.Server{Handler: mux}
	v.appAddr = l.Addr().String()
	go func() { _ = v.app.Serve(l) }()
	return nil
}

// onboard does what the onboarding agent on the VM does: read the platform
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
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: endpoint.AWSCredentialToProto(cred)},
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

// sidecarSettings are what the demo knows about reaching Embark's xDS
// server that the bootstrap does not carry.
type sidecarSettings struct {
	serverName string // the name its certificate holds
	rootCA     []byte // PEM of the CA that signed it
}

// startSidecar runs Istio's pilot-agent (DISABLE_ENVOY=true) as the VM's
// sidecar, configured from the registration's bootstrap as the onboarding
// agent configures it: node ID parts, cluster, labels, ProxyConfig (the
// discovery address and the WorkloadGroup's readiness probe), and the bound
// sidecar token in its token file; the xDS server's TLS is verified with
// the demo CA. It then plays Envoy's part on pilot-agent's XDS socket (CDS and LDS,
// ACKing every response), which makes pilot-agent open its authenticated ADS
// stream to Embark.
func (v *vm) startSidecar(ctx context.Context, t *demoTB, s sidecarSettings) error {
	b := v.bootstrap
	pc := &meshconfig.ProxyConfig{}
	if err := protojson.Unmarshal([]byte(b.GetProxyConfigJson()), pc); err != nil {
		return fmt.Errorf("decode the bootstrap's ProxyConfig: %w", err)
	}
	pc.ControlPlaneAuthPolicy = meshconfig.AuthenticationPolicy_MUTUAL_TLS
	v.sidecar = istioagent.Start(t, istioagent.Options{
		PodName:        v.registration,
		PodNamespace:   "bookinfo",
		InstanceIP:     b.GetInstanceIp(),
		ClusterID:      b.GetClusterId(),
		ServiceAccount: b.GetServiceAccount(),
		Labels:         b.GetLabels(),
		ProxyConfig:    pc,
		XDSRootCA:      s.rootCA,
		IstiodSAN:      s.serverName,
		Token:          b.GetSidecarToken(),
	})
	return v.connectEnvoy(ctx)
}

// connectEnvoy opens the stream Envoy would open on pilot-agent's XDS
// socket and ACKs whatever arrives until the stream ends.
func (v *vm) connectEnvoy(ctx context.Context) error {
	ectx, cancel := context.WithCancel(ctx)
	c, err := istioagent.Connect(ectx, v.sidecar)
	if err != nil {
		cancel()
		return err
	}
	for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
		if err := c.Send(typ, nil, "", ""); err != nil {
			cancel()
			return err
		}
	}
	v.envoy, v.stopEnvoy = c, cancel
	go func() {
		for {
			resp, err := c.Recv(ectx)
			if err != nil {
				return
			}
			if err := c.ACK(resp); err != nil {
				return
			}
		}
	}()
	return nil
}

// stopSidecar stops pilot-agent, as when the VM's sidecar is stopped or the
// VM goes away.
func (v *vm) stopSidecar() {
	if v.stopEnvoy != nil {
		v.stopEnvoy()
		_ = v.envoy.Close()
	}
	if v.sidecar != nil {
		v.sidecar.Stop()
	}
}

// close stops the VM's application (its IMDS belongs to simulatedAWS).
func (v *vm) close() {
	if v.app != nil {
		_ = v.app.Close()
	}
}
