//go:build install

package install

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/fixtures"
)

// TestInstallAsAUserDoes is the path a platform engineer takes, end to
// end: the chart installed with README.md's `helm install` values on a real
// API server beside a real istiod (StartCluster: the endpoint runs from the
// image `make image` built, in runc, through the kubelet stand-in), the
// cluster-side objects of docs/operator-guide.md applied, then a VM on a
// network of its own that reaches only the vmgateway address follows
// docs/vm-install.md's blocks as written (FollowGuide): apt installs Istio's
// sidecar and the agent from the endpoint's signed repository through the
// gateway's 443, the agent onboards on 15443 with its EC2 identity, the
// sidecar gets its workload certificate from istiod's CA through Embark and
// its configuration through Embark's relay on 15012. It ends with the
// registration AgentConnected=True, the certificate chaining to istiod's
// root, and `istioctl proxy-status` against istiod listing the VM SYNCED.
//
// Two values are added to the README's, each a documented option, because
// two parts of the world are stand-ins: the EC2 instance is awstest's (its
// identity document is signed by a CA of the test's own, which
// identity.aws.certificatesDir trusts, mounted with extraVolumes, as an
// operator mounts the certificate of a region Embark does not embed), and
// Istio's istio-sidecar package is the test's build of it
// (BuildIstioSidecarDeb), which the operator adds from a volume
// (localRepository.extraSources, docs/local-repository.md).
func TestInstallAsAUserDoes(t *testing.T) {
	vmNet := NewNetwork(t, "embark-vm", "10.201.0.1/30", "10.201.0.2/30", false)
	aws := awstest.Start(t, awstest.Instance{PrivateIP: vmNet.PeerIP.String()})
	ServeIMDS(t, vmNet, aws.IMDS.URL)

	c := StartCluster(t, ClusterOptions{ValuesFromREADME: true, ExtraValues: []string{simulatedWorldValues(t, aws, worldOptions{})}, GatewayIP: vmNet.HostIP})
	vm := StartVM(t, vmNet, map[string]netip.Addr{c.Host: c.GatewayIP})
	ctx := t.Context()
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := vm.Run(context.WithoutCancel(ctx), "journalctl; tail -n 40 /var/log/istio/istio.log /var/log/istio/istio.err.log || true", nil)
			t.Logf("the VM's journal (stand-in) and Istio's log:\n%s\nthe endpoint's log:\n%s", out, c.Log())
		}
	})

	t.Log("the VM reaches the gateway's address only: not the API server, istiod or the endpoint's Pod")
	u, err := url.Parse(c.REST.Host)
	must(t, err)
	unreachable := map[string]string{
		"the endpoint's Pod":     net.JoinHostPort(strings.TrimSuffix(podPeerCIDR, "/30"), "15443"),
		"the Pod network's host": net.JoinHostPort(strings.TrimSuffix(podHostCIDR, "/30"), "15012"),
	}
	// The host's loopback listeners, at their own address and at the VM
	// network's host address (the gateway's, on the same port).
	for name, addr := range map[string]string{"kube-apiserver": u.Host, "istiod (xDS and CA)": c.Istiod.SecureGRPCAddr, "istiod (plaintext)": c.Istiod.GRPCAddr} {
		_, port, err := net.SplitHostPort(addr)
		must(t, err)
		unreachable[name] = addr
		unreachable[name+" via the VM network's host"] = net.JoinHostPort(vmNet.HostIP.String(), port)
	}
	for name, addr := range unreachable {
		if err := vm.Connect(ctx, addr); err == nil {
			t.Errorf("the VM connected to %s at %s", name, addr)
		}
	}
	for _, port := range []string{"443", "15443", "15012"} {
		if err := vm.Connect(ctx, net.JoinHostPort(c.GatewayIP.String(), port)); err != nil {
			t.Fatalf("the VM cannot reach the gateway's port %s: %v", port, err)
		}
	}

	t.Log("docs/vm-install.md, as written, with the CA and keys the operator has")
	FollowGuide(t, vm, c.Host, c.ServingCA, c.RepositoryKeyFingerprints)
	for _, pkg := range []string{"onboarding-agent", "istio-sidecar"} {
		if got, err := vm.Run(ctx, "dpkg-query -W -f '${Status}' "+pkg, nil); err != nil || got != "install ok installed" {
			t.Errorf("%s: %q %v", pkg, got, err)
		}
	}

	t.Log("onboarded: one registration in the operator guide's namespace, with the VM's EC2 address")
	reg := waitRegistration(t, c, vmNet)
	t.Log("onboarding-agent-sidecar.path: the bootstrap installed where istio.service reads it, istio.service started")
	waitBootstrapInstalled(t, vm, reg)
	for _, f := range []string{"/etc/istio/config/mesh", "/etc/certs/embark-root-cert.pem"} {
		if _, err := vm.ReadFile(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if out, err := vm.Run(ctx, "systemctl status onboarding-agent istio --no-pager", nil); err != nil {
		t.Errorf("the guide's check: systemctl status: %v\n%s", err, out)
	}
	cenv, err := vm.ReadFile("/var/lib/istio/envoy/cluster.env")
	must(t, err)
	if want := "PILOT_ADDRESS='" + net.JoinHostPort(c.Host, "15012") + "'"; !strings.Contains(cenv, want) {
		t.Errorf("cluster.env lacks %s (the guide's check):\n%s", want, cenv)
	}

	t.Log("the sidecar: its certificate from istiod's CA, AgentConnected=True, SYNCED at istiod")
	checkSidecarConnected(t, c, vm, reg)
	t.Log("the group's probe through the sidecar: the WorkloadEntry is Healthy while the VM's application answers /health, and not once it stops")
	app := serveHealth(t, vmNet)
	healthy := func(want string) func() bool {
		return func() bool {
			out, err := c.Env.Kubectl(ctx, nil, "get", "workloadentry", "-n", guideNamespace, reg.Name,
				"-o", `jsonpath={.status.conditions[?(@.type=="Healthy")].status}`)
			return err == nil && out == want
		}
	}
	fixtures.Eventually(t, 60*time.Second, "WorkloadEntry Healthy=True", healthy("True"))
	must(t, app.Close())
	fixtures.Eventually(t, 60*time.Second, "WorkloadEntry Healthy=False once the application stops", healthy("False"))

	// EDS and RDS are IGNORED, not asked for: the operator guide's
	// namespace has no Service, so istiod sends no EDS cluster and no
	// listener that names routes (test/istiod covers both with Services).
	checkProxyStatus(t, c.IstiodAddr, map[string]string{reg.Name + "." + guideNamespace: "istiod-local"}, "CDS", "LDS")
}

// guideNamespace is the namespace of docs/operator-guide.md's
// WorkloadGroup, which docs/vm-install.md's first block names too.
const guideNamespace = "bookinfo"

// simulatedWorldValues writes the values file of the two documented options
// the simulated world needs (see TestInstallAsAUserDoes) and returns its
// path: identity.aws.certificatesDir on a hostPath volume holding the
// awstest region's certificate, and localRepository.extraSources with the
// test's istio-sidecar package (and its RPM, with o.RPMSigningKey). Each
// of o.Mounts is one more hostPath directory in extraVolumes and
// extraVolumeMounts (Helm replaces lists, so every volume the release
// needs is in this one file).
func simulatedWorldValues(t *testing.T, aws *awstest.Env, o worldOptions) string {
	t.Helper()
	base := t.TempDir()
	certs := filepath.Join(base, "aws-certificates")
	must(t, os.MkdirAll(certs, 0o755))
	must(t, os.WriteFile(filepath.Join(certs, "us-east-2.pem"), aws.CA.CertificatePEM(), 0o644))
	sidecar := filepath.Join(base, "istio-sidecar")
	must(t, os.MkdirAll(sidecar, 0o755))
	BuildIstioSidecarDeb(t, sidecar)
	if o.RPMSigningKey != "" {
		BuildIstioSidecarRPM(t, sidecar, o.RPMSigningKey)
	}
	must(t, filepath.Walk(sidecar, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if fi.IsDir() {
			mode = 0o755
		}
		return os.Chmod(p, mode)
	}))
	must(t, os.Chmod(base, 0o755))
	mounts := append([]hostMount{{Name: "aws-certificates", HostPath: certs, MountPath: "/etc/embark/aws-certificates"}}, o.Mounts...)
	var volumes, volumeMounts strings.Builder
	for _, m := range mounts {
		fmt.Fprintf(&volumes, "- name: %s\n  hostPath:\n    path: %s\n    type: Directory\n", m.Name, m.HostPath)
		fmt.Fprintf(&volumeMounts, "- name: %s\n  mountPath: %s\n  readOnly: true\n", m.Name, m.MountPath)
	}
	values := fmt.Sprintf(`identity:
  aws:
    certificatesDir: /etc/embark/aws-certificates
extraVolumes:
%sextraVolumeMounts:
%slocalRepository:
  extraSources:
  - name: istio-sidecar
    volume:
      hostPath:
        path: %s
        type: Directory
`, volumes.String(), volumeMounts.String(), sidecar)
	file := filepath.Join(t.TempDir(), "simulated-world.yaml")
	must(t, os.WriteFile(file, []byte(values), 0o600))
	return file
}

// worldOptions are simulatedWorldValues' additions.
type worldOptions struct {
	// RPMSigningKey, when set, adds the istio-sidecar RPM signed with it.
	RPMSigningKey string
	// Mounts are more host directories the endpoint's Pod mounts.
	Mounts []hostMount
}

// hostMount is a host directory the endpoint's Pod mounts read-only.
type hostMount struct{ Name, HostPath, MountPath string }

// serveHealth runs the VM's application as the operator guide's group
// probes it: an HTTP server on the VM's address, port 8080, answering
// /health, inside the VM's network namespace. Close stops it.
func serveHealth(t *testing.T, n *Network) net.Listener {
	t.Helper()
	l, err := n.Listen("tcp", net.JoinHostPort(n.PeerIP.String(), "8080"))
	must(t, err)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l
}
