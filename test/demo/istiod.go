package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/testenv"
)

// The demo runs in istiod mode: a real istiod (pilot-discovery, the one the
// tests use) runs beside the endpoint, which relays each sidecar's
// certificate requests to istiod's CA and its discovery stream to istiod.
// This file holds istiod's part of the demo.

// istiodPodName is istiod's POD_NAME (testenv.StartIstiod): what istioctl
// prints in the ISTIOD column for proxies connected to it.
const istiodPodName = "istiod-local"

// vmOutputCerts is where each VM's pilot-agent writes the workload
// certificate it got (OUTPUT_CERTS): with Envoy it would serve it over SDS
// only; without Envoy (DISABLE_ENVOY=true) it serves no SDS socket, so the
// demo reads the files.
const vmOutputCerts = "etc/istio/output-certs"

// ratingsPort is the port of the ratings Service and of its VMs' endpoints:
// the port of the seed's Sidecar (ingress 8080 to the application on
// 127.0.0.1:8080; egress on 8080 to the services of bookinfo), so that each
// VM's own configuration from istiod has an outbound listener, its route
// (RDS) and an EDS cluster.
const ratingsPort = 8080

// startIstiod starts istiod against the demo's API server, with Istio's
// defaults for its CA, auto-registration and health checks, and creates the
// ratings Service that selects the VMs.
func (d *demo) startIstiod(ctx context.Context, out io.Writer) error {
	start := time.Now()
	i, err := testenv.StartIstiod(ctx, d.env, testenv.IstiodOptions{})
	if err != nil {
		return err
	}
	d.istiod = i
	d.istiodRoot = filepath.Join(d.work, "istiod-root-cert.pem")
	if err := os.WriteFile(d.istiodRoot, i.RootCert, 0o600); err != nil {
		return err
	}
	root, err := firstCert(i.RootCert)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "istiod ready in %v: xDS and CA (TLS) %s, plaintext xDS %s (for istioctl), debug %s\n",
		time.Since(start).Round(100*time.Millisecond), i.SecureGRPCAddr, i.GRPCAddr, i.HTTPAddr)
	fmt.Fprintf(out, "istiod's CA root (ConfigMap istio-ca-root-cert): %s, valid until %s\n", root.Subject, root.NotAfter.UTC().Format(time.RFC3339))
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: "bookinfo"}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "ratings"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: ratingsPort, TargetPort: intstr.FromInt32(ratingsPort)}},
	}}
	if err := d.env.Client.Create(ctx, svc); err != nil {
		return err
	}
	if err := d.kubectl(ctx, out, "get", "service", "ratings", "-n", "bookinfo"); err != nil {
		return err
	}
	if err := d.startPodProxy(ctx, out); err != nil {
		return err
	}
	// No VM yet: istiod serves ratings without endpoints.
	return d.showRatingsEndpoints(ctx, out, map[string]bool{})
}

// stopIstiod stops istiod and removes its files.
func (d *demo) stopIstiod() {
	if d.pod != nil {
		d.pod.close()
	}
	if d.istiod != nil {
		_ = d.istiod.Close()
	}
}

// istiodConfig is the endpoint configuration's istiod block: certificates
// from istiod's CA and the whole configuration from istiod, both through
// the endpoint.
func (d *demo) istiodConfig() string {
	return fmt.Sprintf(`istiod:
  address: %s
  serverName: %s
  # istiod's CA root (ConfigMap istio-ca-root-cert), to verify istiod.
  rootCertFile: %s
  # istiod mode: relay each sidecar's discovery stream to istiod.
  relayXDS: true
`, d.istiod.SecureGRPCAddr, testenv.IstiodServerName, d.istiodRoot)
}

// sidecarEnv is what the demo adds to the environment of each VM's
// pilot-agent beyond the bootstrap's cluster.env.
func sidecarEnv(root string) map[string]string {
	return map[string]string{"OUTPUT_CERTS": filepath.Join(root, vmOutputCerts)}
}

// certificateIdentity shows the workload certificate each VM's sidecar got
// from istiod's CA through the endpoint and checks its identity (the
// WorkloadGroup's service account) and that it chains to istiod's root.
func (d *demo) certificateIdentity(ctx context.Context, out io.Writer) error {
	wg := &istionetworkingv1.WorkloadGroup{}
	if err := d.env.Client.Get(ctx, client.ObjectKey{Namespace: "bookinfo", Name: "ratings"}, wg); err != nil {
		return err
	}
	want := "spiffe://cluster.local/ns/bookinfo/sa/" + wg.Spec.GetTemplate().GetServiceAccount()
	fmt.Fprintf(out, "WorkloadGroup ratings: serviceAccount %s; istiod's CA root %s\n", wg.Spec.GetTemplate().GetServiceAccount(), d.istiodRoot)
	for _, v := range d.vms {
		dir := filepath.Join(v.root, vmOutputCerts)
		var leaf *x509.Certificate
		if err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
			var err error
			leaf, err = d.checkWorkloadCert(dir, want)
			return err
		}); err != nil {
			v.mu.Lock()
			sidecar := v.sidecar
			v.mu.Unlock()
			var log string
			if sidecar != nil {
				log = tail(grepLines(sidecar.Logs(), "cert", "CA", "error"), 15)
			}
			return fmt.Errorf("%s: %w\npilot-agent's log about certificates (tail):\n%s", v.name, err, indent(log))
		}
		fmt.Fprintf(out, "%s (%s) %s:\n", v.name, v.reg(), filepath.Join(dir, "cert-chain.pem"))
		fmt.Fprintf(out, "    subject  %s\n    URI SAN  %s\n    issuer   %s\n    valid    %s to %s\n    verified against istiod's root: ok; root-cert.pem is istiod's root\n",
			subjectOf(leaf), leaf.URIs[0], leaf.Issuer, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// checkWorkloadCert reads the certificate pilot-agent wrote in dir and
// checks it: one URI SAN, want; chains to istiod's root; root-cert.pem is
// istiod's root.
func (d *demo) checkWorkloadCert(dir, want string) (*x509.Certificate, error) {
	chainPEM, err := os.ReadFile(filepath.Join(dir, "cert-chain.pem"))
	if err != nil {
		return nil, fmt.Errorf("no workload certificate yet: %w", err)
	}
	chain, err := parseCerts(chainPEM)
	if err != nil || len(chain) == 0 {
		return nil, fmt.Errorf("cert-chain.pem: no certificate (%v)", err)
	}
	leaf := chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		return nil, fmt.Errorf("workload certificate URI SANs %v, want [%s]", leaf.URIs, want)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: d.istiod.RootPool(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("workload certificate does not chain to istiod's root: %w", err)
	}
	rootPEM, err := os.ReadFile(filepath.Join(dir, "root-cert.pem"))
	if err != nil {
		return nil, err
	}
	root, err := firstCert(rootPEM)
	if err != nil {
		return nil, fmt.Errorf("root-cert.pem: %w", err)
	}
	istiodRoot, err := firstCert(d.istiod.RootCert)
	if err != nil {
		return nil, err
	}
	if !root.Equal(istiodRoot) {
		return nil, fmt.Errorf("root-cert.pem (%s) is not istiod's root (%s)", root.Subject, istiodRoot.Subject)
	}
	return leaf, nil
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out, nil
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

func firstCert(data []byte) (*x509.Certificate, error) {
	certs, err := parseCerts(data)
	if err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return certs[0], nil
}

// istiodProxyStatus runs seed 000's plain `istioctl proxy-status` against
// istiod: every VM listed as <registration>.bookinfo with istiod in the
// ISTIOD column, then per type: CDS, LDS, EDS and RDS SYNCED.
func (d *demo) istiodProxyStatus(ctx context.Context, out io.Writer) error {
	want := map[string]string{}
	for _, v := range d.vms {
		want[v.reg()+".bookinfo"] = istiodPodName
	}
	args := []string{"proxy-status", "--xds-address", d.istiod.GRPCAddr, "--plaintext", "-r", "default"}
	if err := d.istioctlChecked(ctx, out, func(s string) error { return checkProxyStatus(s, want) }, args...); err != nil {
		return err
	}
	return d.istioctlChecked(ctx, out, func(s string) error {
		if err := checkProxyStatus(s, want); err != nil {
			return err
		}
		return checkSynced(s, len(want), "CDS", "LDS", "EDS", "RDS")
	}, append(args, "-v", "1")...)
}

// istioctlChecked runs istioctl until check accepts its output, then shows
// the command and the output (the last one on timeout).
func (d *demo) istioctlChecked(ctx context.Context, out io.Writer, check func(string) error, args ...string) error {
	var shown string
	err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		s, err := istioagent.Istioctl(ctx, d.tb, args...)
		if err != nil {
			return err
		}
		shown = s
		return check(s)
	})
	fmt.Fprintf(out, "$ istioctl %s\n%s", strings.Join(args, " "), shown)
	return err
}

// podProxy is the proxy of a pod of another workload (productpage) as
// istiod sees it: an ADS stream to istiod with a pod's node ID, subscribed
// to the endpoints (EDS) of the ratings Service. It uses istiod's plaintext
// port, which authenticates nobody (tests and demos only); istiod serves it
// what it serves a pod.
type podProxy struct {
	nodeID  string
	cluster string
	conn    *grpc.ClientConn
	cancel  context.CancelFunc

	mu   sync.Mutex
	last *endpointv3.ClusterLoadAssignment
	err  error
}

// startPodProxy connects productpage's proxy to istiod.
func (d *demo) startPodProxy(ctx context.Context, out io.Writer) error {
	conn, err := grpc.NewClient(d.istiod.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &podProxy{
		nodeID:  "sidecar~10.244.0.9~productpage-v1-5d9c8b7f6-x2v4k.bookinfo~bookinfo.svc.cluster.local",
		cluster: fmt.Sprintf("outbound|%d||ratings.bookinfo.svc.cluster.local", ratingsPort),
		conn:    conn, cancel: cancel,
	}
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(pctx)
	if err != nil {
		p.close()
		return err
	}
	node := &core.Node{Id: p.nodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"CLUSTER_ID":    structpb.NewStringValue("Kubernetes"),
		"NAMESPACE":     structpb.NewStringValue("bookinfo"),
		"ISTIO_VERSION": structpb.NewStringValue("1.30.0"),
		"LABELS":        structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"app": structpb.NewStringValue("productpage")}}),
	}}}
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{p.cluster}}); err != nil {
		p.close()
		return err
	}
	go p.run(st)
	d.pod = p
	fmt.Fprintf(out, "productpage's proxy (node %s) subscribes to EDS %s on istiod\n", p.nodeID, p.cluster)
	return nil
}

func (p *podProxy) run(st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient) {
	for {
		resp, err := st.Recv()
		if err == nil {
			err = st.Send(&discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(), ResourceNames: []string{p.cluster}})
		}
		if err != nil {
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
			return
		}
		for _, r := range resp.GetResources() {
			cla := &endpointv3.ClusterLoadAssignment{}
			if r.UnmarshalTo(cla) == nil && cla.GetClusterName() == p.cluster {
				p.mu.Lock()
				p.last = cla
				p.mu.Unlock()
			}
		}
	}
}

func (p *podProxy) close() {
	p.cancel()
	_ = p.conn.Close()
}

// servedEndpoint is one endpoint of ratings as istiod serves it to the pod.
type servedEndpoint struct {
	address, health, locality string
}

// endpoints returns the latest endpoints istiod served, by address.
func (p *podProxy) endpoints() (map[string]servedEndpoint, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, fmt.Errorf("istiod closed productpage's stream: %w", p.err)
	}
	if p.last == nil {
		return nil, errors.New("istiod has sent no endpoints of ratings yet")
	}
	out := map[string]servedEndpoint{}
	for _, le := range p.last.GetEndpoints() {
		loc := le.GetLocality()
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			addr := fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
			out[sa.GetAddress()] = servedEndpoint{address: addr, health: lb.GetHealthStatus().String(), locality: loc.GetRegion() + "/" + loc.GetZone()}
		}
	}
	return out, nil
}

// routable reports whether a pod's Envoy sends traffic to e.
func (e servedEndpoint) routable() bool {
	return e.health == core.HealthStatus_HEALTHY.String() || e.health == core.HealthStatus_UNKNOWN.String()
}

// showRatingsEndpoints waits until istiod serves the pod exactly the VMs
// of want as routable endpoints of ratings (by IP; false: served
// unhealthy or not at all), then shows them.
func (d *demo) showRatingsEndpoints(ctx context.Context, out io.Writer, want map[string]bool) error {
	var last map[string]servedEndpoint
	err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		got, err := d.pod.endpoints()
		if err != nil {
			return err
		}
		last = got
		var problems []string
		for _, ip := range sortedBoolKeys(want) {
			if e, ok := got[ip]; want[ip] && (!ok || !e.routable()) {
				problems = append(problems, fmt.Sprintf("%s is not served as a routable endpoint (%+v)", ip, e))
			} else if !want[ip] && ok && e.routable() {
				problems = append(problems, fmt.Sprintf("%s is still served as routable", ip))
			}
		}
		for ip, e := range got {
			if _, ok := want[ip]; !ok && e.routable() {
				problems = append(problems, fmt.Sprintf("%s is served but belongs to no VM of the demo", ip))
			}
		}
		if len(problems) > 0 {
			return errors.New(strings.Join(problems, "; "))
		}
		return nil
	})
	fmt.Fprintf(out, "istiod's EDS for productpage's proxy, cluster %s:\n", d.pod.cluster)
	addrs := make([]string, 0, len(last))
	for ip := range last {
		addrs = append(addrs, ip)
	}
	sort.Strings(addrs)
	fmt.Fprintf(out, "    %-18s %-10s %s\n", "ENDPOINT", "HEALTH", "LOCALITY")
	if len(addrs) == 0 {
		fmt.Fprintln(out, "    (none)")
	}
	for _, ip := range addrs {
		e := last[ip]
		fmt.Fprintf(out, "    %-18s %-10s %s\n", e.address, e.health, e.locality)
	}
	return err
}

// ratingsEndpoints checks that istiod serves every connected VM to the pod.
func (d *demo) ratingsEndpoints(ctx context.Context, out io.Writer) error {
	return d.showRatingsEndpoints(ctx, out, d.wantEndpoints(nil, nil))
}

// wantEndpoints is every VM routable but unhealthy (not routable) and gone
// (not served at all; nil: none).
func (d *demo) wantEndpoints(unhealthy, gone *vm) map[string]bool {
	want := map[string]bool{}
	for _, v := range d.vms {
		if v != gone {
			want[v.imds.Instance().PrivateIP] = v != unhealthy
		}
	}
	if gone != nil {
		want[gone.imds.Instance().PrivateIP] = false
	}
	return want
}

func sortedBoolKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// grepLines returns the lines of s that contain any of words.
func grepLines(s string, words ...string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// subjectOf returns c's subject; istiod's workload certificates have none
// (the identity is the URI SAN).
func subjectOf(c *x509.Certificate) string {
	if s := c.Subject.String(); s != "" {
		return s
	}
	return "(empty: the identity is the URI SAN)"
}
