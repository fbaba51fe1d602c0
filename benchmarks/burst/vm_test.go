package burst

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/endpointproc"
)

// vm is one simulated VM of a burst: its signed identity document, and once
// onboarded its sidecar's token and node.
type vm struct {
	inst     awstest.Instance
	doc, sig []byte
	csr      string

	token string
	node  *core.Node
	// retries counts the certificate requests of join refused with
	// ResourceExhausted or Unavailable and sent again.
	retries atomic.Int64
	stream  *adsclient.SotW
	conns   []*grpc.ClientConn
}

// times are when a VM reached each step, from the burst's start.
type times struct {
	onboarded, certified, member time.Duration
}

// newVM is the VM of instance number n with its document signed by ca and
// its certificate request made beforehand.
func newVM(ca *awstest.CA, n int, csr string) (*vm, error) {
	a := endpointproc.NewAgent(n)
	doc := a.Instance.Document()
	sig, err := ca.Sign(doc)
	if err != nil {
		return nil, err
	}
	return &vm{inst: a.Instance, doc: doc, sig: sig, csr: csr}, nil
}

// join is what a VM's agent and sidecar do at boot: Authorize and Register
// (the onboarding API), then, at once, its workload certificate from
// istiod through Embark's CA relay and its ADS stream through Embark's xDS
// relay with CDS and LDS each answered and ACKed (pilot-agent fetches the
// certificate while Envoy's discovery requests go through its xDS proxy).
// The VM is a mesh member when both are done. It returns when it reached
// each step, from start.
func (v *vm) join(ctx context.Context, d *deployment, start time.Time) (times, error) {
	var t times
	creds := credentials.NewTLS(d.tlsConfig())
	api, err := grpc.NewClient(d.ep.Config.Listen.Onboarding, grpc.WithTransportCredentials(creds))
	if err != nil {
		return t, err
	}
	v.conns = append(v.conns, api)
	if err := v.onboard(ctx, onboardingv1alpha1.NewOnboardingServiceClient(api), d.ns); err != nil {
		return t, err
	}
	t.onboarded = time.Since(start)
	xds, err := grpc.NewClient(d.ep.Config.Listen.XDS, grpc.WithTransportCredentials(creds))
	if err != nil {
		return t, err
	}
	v.conns = append(v.conns, xds)
	certified := make(chan error, 1)
	go func() {
		_, err := v.certificate(ctx, securityv1alpha1.NewIstioCertificateServiceClient(xds), d.istiod.RootPool(), &v.retries)
		t.certified = time.Since(start)
		certified <- err
	}()
	cfgErr := v.configure(ctx, xds)
	certErr := <-certified
	if err := errors.Join(certErr, cfgErr); err != nil {
		return t, err
	}
	t.member = time.Since(start)
	return t, nil
}

// onboard authorizes with the signed identity document and registers in
// the fixture's group, as the agent does.
func (v *vm) onboard(ctx context.Context, api onboardingv1alpha1.OnboardingServiceClient, ns string) error {
	auth, err := api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: ns, Name: endpointproc.Group},
		Credential: &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: &onboardingv1alpha1.AWSCredential{
			InstanceIdentityDocument: v.doc, Rsa2048Signature: string(v.sig)}},
	})
	if err != nil {
		return fmt.Errorf("authorize %s: %w", v.inst.InstanceID, err)
	}
	reg, err := api.Register(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
		Addresses: []*onboardingv1alpha1.HostAddress{{Ip: v.inst.PrivateIP, Type: "VPC"}},
	})
	if err != nil {
		return fmt.Errorf("register %s: %w", v.inst.InstanceID, err)
	}
	boot := reg.GetBootstrap()
	proxyConfig := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(boot.GetProxyConfigJson()), proxyConfig); err != nil {
		return fmt.Errorf("proxy config of %s: %w", v.inst.InstanceID, err)
	}
	v.token = boot.GetSidecarToken()
	v.node = &core.Node{Id: boot.GetNodeId(), Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG":  structpb.NewStructValue(proxyConfig),
		"ISTIO_VERSION": structpb.NewStringValue("1.30.0"),
		"CLUSTER_ID":    structpb.NewStringValue("Kubernetes"),
	}}}
	return nil
}

// Certificate retries: pilot-agent sends a refused certificate request
// again with a backoff; a request refused with ResourceExhausted (the CA
// relay's rate or in-flight limit) or Unavailable is sent again after a
// jittered, doubling wait, at most maxCSRAttempts times in all.
const (
	csrBackoff      = 100 * time.Millisecond
	csrBackoffMax   = 2 * time.Second
	maxCSRAttempts  = 30
	csrValiditySecs = 24 * 3600 // pilot-agent's default SECRET_TTL
)

// certificate asks ca for the VM's workload certificate with its sidecar
// token, checks that it chains to roots (istiod's CA) and returns how long
// the request that succeeded took. With retries set, refusals of the CA
// relay's limits are retried and counted there; without, the first answer
// is final.
func (v *vm) certificate(ctx context.Context, ca securityv1alpha1.IstioCertificateServiceClient, roots *x509.CertPool, retries *atomic.Int64) (time.Duration, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+v.token)
	wait := csrBackoff
	for attempt := 1; ; attempt++ {
		t0 := time.Now()
		resp, err := ca.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: v.csr, ValidityDuration: csrValiditySecs})
		took := time.Since(t0)
		if err == nil {
			return took, verifyChain(resp.GetCertChain(), roots)
		}
		code := status.Code(err)
		if retries == nil || (code != codes.ResourceExhausted && code != codes.Unavailable) || attempt == maxCSRAttempts {
			return took, fmt.Errorf("certificate of %s (attempt %d): %w", v.inst.InstanceID, attempt, err)
		}
		retries.Add(1)
		select {
		case <-ctx.Done():
			return took, ctx.Err()
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, csrBackoffMax)
	}
}

// verifyChain checks that chain (PEM certificates, leaf first) chains to
// roots.
func verifyChain(chain []string, roots *x509.CertPool) error {
	var certs []*x509.Certificate
	for _, p := range chain {
		rest := []byte(p)
		for {
			var blk *pem.Block
			if blk, rest = pem.Decode(rest); blk == nil {
				break
			}
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return fmt.Errorf("workload certificate: %w", err)
			}
			certs = append(certs, c)
		}
	}
	if len(certs) == 0 {
		return errors.New("workload certificate: empty chain")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("workload certificate does not chain to istiod's root: %w", err)
	}
	return nil
}

// configure opens the VM's ADS stream and subscribes to CDS, then LDS, as
// Envoy does, ACKing each; the stream stays open (read by drain) until the
// VM is closed.
func (v *vm) configure(ctx context.Context, conn *grpc.ClientConn) error {
	st, err := adsclient.OpenSotW(context.WithoutCancel(ctx), conn, v.token, v.node)
	if err != nil {
		return fmt.Errorf("ADS stream of %s: %w", v.inst.InstanceID, err)
	}
	v.stream = st
	for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
		if err := st.Request(typ); err != nil {
			return fmt.Errorf("%s request of %s: %w", typ, v.inst.InstanceID, err)
		}
		if err := ackType(st, typ); err != nil {
			return fmt.Errorf("%s of %s: %w", typ, v.inst.InstanceID, err)
		}
	}
	go func() { _ = drain(st) }()
	return nil
}

// responseTimeout bounds the wait for one response (a guard against a hung
// run, not a timing assertion).
const responseTimeout = 5 * time.Minute

// ackType ACKs responses until one of typ was ACKed; that one must carry
// resources (istiod configures every VM with the namespace's Services).
func ackType(st *adsclient.SotW, typ string) error {
	for {
		resp, err := st.Recv(responseTimeout)
		if err != nil {
			return err
		}
		if err := st.ACK(resp); err != nil {
			return err
		}
		if resp.GetTypeUrl() == typ {
			if len(resp.GetResources()) == 0 {
				return errors.New("empty response")
			}
			return nil
		}
	}
}

// drain ACKs every push as a sidecar does, until the stream ends.
func drain(st *adsclient.SotW) error {
	for {
		resp, err := st.Recv(-1)
		if err != nil {
			return err
		}
		if err := st.ACK(resp); err != nil {
			return err
		}
	}
}

// close ends the VM's stream and connections.
func (v *vm) close() {
	if v.stream != nil {
		v.stream.Close()
	}
	for _, c := range v.conns {
		_ = c.Close()
	}
}
