package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/demo/istiodview"
	"github.com/embark-mesh/embark/test/demo/step"
	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/meshnet"
	"github.com/embark-mesh/embark/test/testenv"
)

// The demo runs in istiod mode: a real istiod (pilot-discovery, the one the
// tests use) runs beside the endpoint, which relays each sidecar's
// certificate requests to istiod's CA and its discovery stream to istiod.
// This file holds istiod's part of the demo.

// istiodPodName is istiod's POD_NAME (testenv.StartIstiod): what istioctl
// prints in the ISTIOD column for proxies connected to it.
const istiodPodName = "istiod-local"

// ratingsPort is the port of the ratings Service and of its VMs' endpoints:
// the port of the seed's Sidecar (ingress 8080 to the application on
// 127.0.0.1:8080; egress on 8080 to the services of bookinfo), so that each
// VM's own configuration from istiod has an outbound listener, its route
// (RDS) and an EDS cluster.
const ratingsPort = 8080

// startIstiod declares the pods' network and its gateway, starts istiod
// against the demo's API server, with Istio's defaults for its CA,
// auto-registration and health checks, shows the network gateway istiod
// found, and creates the ratings Service that selects the VMs.
func (d *demo) startIstiod(ctx context.Context, out io.Writer) error {
	if err := d.declarePodNetwork(ctx, out); err != nil {
		return err
	}
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
	root, err := istiodview.FirstCert(i.RootCert)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "istiod ready in %v: xDS and CA (TLS) %s, plaintext xDS %s (for istioctl), debug %s\n",
		time.Since(start).Round(100*time.Millisecond), i.SecureGRPCAddr, i.GRPCAddr, i.HTTPAddr)
	fmt.Fprintf(out, "istiod's CA root (ConfigMap istio-ca-root-cert): %s, valid until %s\n", root.Subject, root.NotAfter.UTC().Format(time.RFC3339))
	if err := d.showGateways(ctx, out, meshnet.Gateway(meshnet.PodNetwork, gatewayAddr, meshnet.GatewayPort)); err != nil {
		return err
	}
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
		d.pod.Close()
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
		dir := filepath.Join(v.Root, vm.OutputCerts)
		var leaf *x509.Certificate
		if err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
			var err error
			leaf, err = istiodview.WorkloadCert(dir, want, d.istiod.RootPool(), d.istiod.RootCert)
			return err
		}); err != nil {
			var log string
			if sidecar := v.Sidecar(); sidecar != nil {
				log = tail(vm.GrepLines(sidecar.Logs(), "cert", "CA", "error"), 15)
			}
			return fmt.Errorf("%s: %w\npilot-agent's log about certificates (tail):\n%s", v.Name, err, step.Indent(log))
		}
		fmt.Fprintf(out, "%s (%s) %s:\n", v.Name, v.Reg(), filepath.Join(dir, "cert-chain.pem"))
		fmt.Fprintf(out, "    subject  %s\n    URI SAN  %s\n    issuer   %s\n    valid    %s to %s\n    verified against istiod's root: ok; root-cert.pem is istiod's root\n",
			istiodview.SubjectOf(leaf), leaf.URIs[0], leaf.Issuer, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// istiodProxyStatus runs a plain `istioctl proxy-status` against
// istiod: every VM listed as <registration>.bookinfo with istiod in the
// ISTIOD column, then per type: CDS, LDS, EDS and RDS SYNCED.
func (d *demo) istiodProxyStatus(ctx context.Context, out io.Writer) error {
	want := map[string]string{}
	for _, v := range d.vms {
		want[v.Reg()+".bookinfo"] = istiodPodName
	}
	args := []string{"proxy-status", "--xds-address", d.istiod.GRPCAddr, "--plaintext", "-r", "default"}
	if err := d.istioctlChecked(ctx, out, func(s string) error { return check.ProxyStatus(s, want) }, args...); err != nil {
		return err
	}
	return d.istioctlChecked(ctx, out, func(s string) error {
		if err := check.ProxyStatus(s, want); err != nil {
			return err
		}
		return check.Synced(s, len(want), "CDS", "LDS", "EDS", "RDS")
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

// startPodProxy connects productpage's proxy to istiod, watching the
// endpoints of ratings.
func (d *demo) startPodProxy(ctx context.Context, out io.Writer) error {
	p, err := istiodview.StartPodProxy(ctx, d.istiod.GRPCAddr, meshnet.PodNetwork, fmt.Sprintf("outbound|%d||ratings.bookinfo.svc.cluster.local", ratingsPort))
	if err != nil {
		return err
	}
	d.pod = p
	fmt.Fprintf(out, "productpage's proxy (node %s, network %s) subscribes to EDS %s on istiod\n", p.NodeID, meshnet.PodNetwork, p.Cluster)
	return nil
}

// showRatingsEndpoints waits until istiod serves the pod exactly the VMs
// of want as routable endpoints of ratings (by IP; false: served
// unhealthy or not at all), then shows them.
func (d *demo) showRatingsEndpoints(ctx context.Context, out io.Writer, want map[string]bool) error {
	var last map[string]istiodview.Endpoint
	err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		got, err := d.pod.Endpoints()
		if err != nil {
			return err
		}
		last = got
		var problems []string
		for _, ip := range sortedBoolKeys(want) {
			if e, ok := got[ip]; want[ip] && (!ok || !e.Routable()) {
				problems = append(problems, fmt.Sprintf("%s is not served as a routable endpoint (%+v)", ip, e))
			} else if !want[ip] && ok && e.Routable() {
				problems = append(problems, fmt.Sprintf("%s is still served as routable", ip))
			}
		}
		for ip, e := range got {
			if _, ok := want[ip]; !ok && e.Routable() {
				problems = append(problems, fmt.Sprintf("%s is served but belongs to no VM of the demo", ip))
			}
		}
		if len(problems) > 0 {
			return errors.New(strings.Join(problems, "; "))
		}
		return nil
	})
	fmt.Fprintf(out, "istiod's EDS for productpage's proxy, cluster %s:\n", d.pod.Cluster)
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
		fmt.Fprintf(out, "    %-18s %-10s %s\n", e.Address, e.Health, e.Locality)
	}
	return err
}

// ratingsEndpoints checks that istiod serves every connected VM to the pod.
func (d *demo) ratingsEndpoints(ctx context.Context, out io.Writer) error {
	return d.showRatingsEndpoints(ctx, out, d.wantEndpoints(nil, nil))
}

// wantEndpoints is every VM routable but unhealthy (not routable) and gone
// (not served at all; nil: none).
func (d *demo) wantEndpoints(unhealthy, gone *vm.VM) map[string]bool {
	want := map[string]bool{}
	for _, v := range d.vms {
		if v != gone {
			want[v.IP()] = v != unhealthy
		}
	}
	if gone != nil {
		want[gone.IP()] = false
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
