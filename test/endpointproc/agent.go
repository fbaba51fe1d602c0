package endpointproc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/adsclient"
)

// Dial opens a plaintext gRPC connection (loopback tests only).
func Dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// Agent is one simulated EC2 instance: its credential, and once onboarded
// its registration and sidecar bootstrap.
type Agent struct {
	Instance awstest.Instance
	// Registration is the name of its WorkloadAutoRegistration.
	Registration string
	// UID is the registration's UID as Register returned it.
	UID         string
	token       string
	sessionKey  string
	nodeID      string
	proxyConfig *structpb.Struct

	connected  atomic.Bool
	connects   atomic.Int64
	acks       atomic.Int64
	mu         sync.Mutex
	lastErr    error
	stopStream context.CancelFunc
	stopped    chan struct{}
}

// NewAgent returns the agent of instance number n (its ID and address
// derive from n).
func NewAgent(n int) *Agent {
	return &Agent{Instance: awstest.Instance{
		InstanceID: fmt.Sprintf("i-%017x", n),
		PrivateIP:  fmt.Sprintf("10.%d.%d.%d", n>>16&255, n>>8&255, n&255),
	}}
}

// Onboard authorizes with the signed identity document and registers in
// namespace/group through api.
func (a *Agent) Onboard(ctx context.Context, api onboardingv1alpha1.OnboardingServiceClient, ca *awstest.CA, namespace, group string) error {
	doc := a.Instance.Document()
	sig, err := ca.Sign(doc)
	if err != nil {
		return err
	}
	auth, err := api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: namespace, Name: group},
		Credential: &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: &onboardingv1alpha1.AWSCredential{
			InstanceIdentityDocument: doc, Rsa2048Signature: string(sig)}},
	})
	if err != nil {
		return fmt.Errorf("authorize %s: %w", a.Instance.InstanceID, err)
	}
	reg, err := api.Register(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
		Addresses: []*onboardingv1alpha1.HostAddress{{Ip: a.Instance.PrivateIP, Type: "VPC"}},
	})
	if err != nil {
		return fmt.Errorf("register %s: %w", a.Instance.InstanceID, err)
	}
	a.Registration = reg.GetRegistrationName()
	a.UID = reg.GetRegistrationUid()
	a.token = reg.GetBootstrap().GetSidecarToken()
	a.sessionKey = reg.GetSessionKey()
	a.nodeID = reg.GetBootstrap().GetNodeId()
	// Istio's agent sends its ProxyConfig as node metadata PROXY_CONFIG,
	// which marks the stream as a sidecar's.
	a.proxyConfig = &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(reg.GetBootstrap().GetProxyConfigJson()), a.proxyConfig); err != nil {
		return fmt.Errorf("proxy config of %s: %w", a.Registration, err)
	}
	return nil
}

// RenewToken authorizes again with the signed identity document and
// renews the agent's sidecar token through api (RenewSidecarToken), as the
// agent does before its token expires; the streams it holds from then on
// present the renewed token. Both calls carry the session key Register
// returned (embark-session-key), as the agent's do. Call it while the agent
// holds no stream.
func (a *Agent) RenewToken(ctx context.Context, api onboardingv1alpha1.OnboardingServiceClient, ca *awstest.CA, namespace, group string) error {
	ctx = metadata.AppendToOutgoingContext(ctx, "embark-session-key", a.sessionKey)
	doc := a.Instance.Document()
	sig, err := ca.Sign(doc)
	if err != nil {
		return err
	}
	auth, err := api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: namespace, Name: group},
		Credential: &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: &onboardingv1alpha1.AWSCredential{
			InstanceIdentityDocument: doc, Rsa2048Signature: string(sig)}},
	})
	if err != nil {
		return fmt.Errorf("authorize %s: %w", a.Instance.InstanceID, err)
	}
	resp, err := api.RenewSidecarToken(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RenewSidecarTokenRequest{})
	if err != nil {
		return fmt.Errorf("renew the sidecar token of %s: %w", a.Registration, err)
	}
	if resp.GetSidecarToken() == "" {
		return fmt.Errorf("renew the sidecar token of %s: no token returned", a.Registration)
	}
	a.token = resp.GetSidecarToken()
	return nil
}

// Token is the agent's sidecar token (Register's, or RenewToken's since):
// what its sidecar presents to Embark's xDS and CA relay.
func (a *Agent) Token() string { return a.token }

// Connected reports whether the agent's ADS stream is open and answered.
func (a *Agent) Connected() bool { return a.connected.Load() }

// Connects counts the streams the server accepted.
func (a *Agent) Connects() int64 { return a.connects.Load() }

// ACKs counts the responses the agent accepted (ACKed), on all its
// streams: a stream resynchronised by istiod is ACKed again.
func (a *Agent) ACKs() int64 { return a.acks.Load() }

// LastError is why the last stream ended or was refused.
func (a *Agent) LastError() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastErr
}

// Hold keeps an ADS stream open until Disconnect, on the first of conns
// that accepts it; when a stream breaks it retries on the next one after a
// short pause, as Istio's agent reconnects to the discovery address.
func (a *Agent) Hold(conns []*grpc.ClientConn) {
	ctx, cancel := context.WithCancel(context.Background())
	a.stopStream, a.stopped = cancel, make(chan struct{})
	go func() {
		defer close(a.stopped)
		for i := 0; ctx.Err() == nil; i++ {
			err := a.stream(ctx, conns[i%len(conns)])
			a.connected.Store(false)
			a.mu.Lock()
			a.lastErr = err
			a.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

// Disconnect closes the agent's stream and stops reconnecting.
func (a *Agent) Disconnect() {
	if a.stopStream != nil {
		a.stopStream()
		<-a.stopped
		a.stopStream = nil
	}
}

func (a *Agent) stream(ctx context.Context, conn *grpc.ClientConn) error {
	node := &core.Node{Id: a.nodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG":  structpb.NewStructValue(a.proxyConfig),
		"ISTIO_VERSION": structpb.NewStringValue("1.30.0"),
		"CLUSTER_ID":    structpb.NewStringValue("Kubernetes"),
	}}}
	s, err := adsclient.OpenSotW(ctx, conn, a.token, node)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Request(resource.ListenerType); err != nil {
		_, rerr := s.Next()
		return fmt.Errorf("send: %w (%v)", err, rerr)
	}
	for {
		resp, err := s.Next()
		if err != nil {
			return err
		}
		if !a.connected.Swap(true) {
			a.connects.Add(1)
		}
		if err := s.ACK(resp); err != nil {
			return err
		}
		a.acks.Add(1)
	}
}
