//go:build install

package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
)

// The VM network of the cluster test alone: its own netns and addresses,
// so it does not meet the VM side's embark-vm when both run.
const (
	probeNetns    = "embark-cvm"
	probeHostCIDR = "10.202.0.1/30"
	probePeerCIDR = "10.202.0.2/30"
)

// The chart installed as the README says, and with the documented options,
// runs from the image and answers on the gateway from a VM's network: the
// onboarding port with the operator's CA for the host, the repository on
// 443 with the signing key the endpoint logged.
func TestCluster(t *testing.T) {
	tests := []struct {
		name   string
		extra  func(t *testing.T) []string
		checks func(t *testing.T, c *Cluster, vm *podNetwork)
	}{
		{name: "README values"},
		{name: "README values and the documented options", extra: documentedOptions, checks: checkDocumentedOptions},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			if tc.extra != nil {
				extra = tc.extra(t)
			}
			vm := newPodNetwork(t, probeNetns, probeHostCIDR, probePeerCIDR, false)
			c := StartCluster(t, ClusterOptions{ValuesFromREADME: true, ExtraValues: extra, GatewayIP: vm.HostIP})
			t.Run("onboarding port: TLS with the serving CA for the host", func(t *testing.T) {
				checkOnboardingTLS(t, c, vm)
			})
			t.Run("443: the repository's key", func(t *testing.T) {
				checkRepositoryKey(t, c, vm)
			})
			if tc.checks != nil {
				tc.checks(t, c, vm)
			}
		})
	}
}

// sidecarPackage stands in for an istio-sidecar package the operator adds
// from a volume (localRepository.extraSources): the repository serves any
// file at a package's path, and its .sha256.
var sidecarPackage = []byte("not a real package: served as a file, left out of the metadata")

// documentedOptions are testdata/cluster-documented-options.yaml and a
// values file of the options that name a path of this machine: an
// extraSources hostPath volume holding deb/amd64/istio-sidecar.deb.
func documentedOptions(t *testing.T) []string {
	dir := filepath.Join(t.TempDir(), "istio-sidecar")
	if err := os.MkdirAll(filepath.Join(dir, "deb", "amd64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "deb", "amd64", "istio-sidecar.deb"), sidecarPackage, 0o644); err != nil {
		t.Fatal(err)
	}
	values := fmt.Sprintf("localRepository:\n  extraSources:\n  - name: istio-sidecar\n    volume:\n      hostPath:\n        path: %s\n        type: Directory\n", dir)
	file := filepath.Join(t.TempDir(), "extra-sources.yaml")
	if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{filepath.Join("testdata", "cluster-documented-options.yaml"), file}
}

// vmGet GETs path of the endpoint's host on 443 through the gateway from
// the VM network.
func vmGet(t *testing.T, c *Cluster, vm *podNetwork, path string) (*http.Response, []byte) {
	t.Helper()
	gateway := net.JoinHostPort(c.GatewayIP.String(), "443")
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   vmTLS(t, c),
		ForceAttemptHTTP2: true, // as curl and apt negotiate: ALPN h2 when offered
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return vm.Dial(network, gateway)
		},
	}}
	resp, err := client.Get("https://" + c.Host + path)
	if err != nil {
		t.Fatalf("GET https://%s%s through the gateway: %v", c.Host, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET https://%s%s on 443: %s (Content-Type %q): %.200s", c.Host, path, resp.Status, resp.Header.Get("Content-Type"), body)
	}
	return resp, body
}

// vmTLS is a VM's TLS configuration for the endpoint: the host's name,
// only the serving CA the operator copied trusted.
func vmTLS(t *testing.T, c *Cluster) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.ServingCA) {
		t.Fatal("ServingCA holds no certificate")
	}
	return &tls.Config{RootCAs: pool, ServerName: c.Host, MinVersion: tls.VersionTLS12}
}

func checkOnboardingTLS(t *testing.T, c *Cluster, vm *podNetwork) {
	raw, err := vm.Dial("tcp", net.JoinHostPort(c.GatewayIP.String(), "15443"))
	if err != nil {
		t.Fatalf("dial the gateway's onboarding port from the VM network: %v", err)
	}
	defer raw.Close()
	cfg := vmTLS(t, c)
	cfg.NextProtos = []string{"h2"}
	conn := tls.Client(raw, cfg)
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := conn.Handshake(); err != nil {
		t.Fatalf("TLS handshake for %s on the onboarding port: %v", c.Host, err)
	}
	if got := conn.ConnectionState().NegotiatedProtocol; got != "h2" {
		t.Errorf("onboarding port negotiated %q, want h2 (gRPC)", got)
	}
}

func checkRepositoryKey(t *testing.T, c *Cluster, vm *podNetwork) {
	_, body := vmGet(t, c, vm, "/install/repository.asc")
	keys, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("repository.asc: not an armored OpenPGP key ring: %v", err)
	}
	var got []string
	for _, k := range keys {
		got = append(got, strings.ToUpper(fmt.Sprintf("%x", k.PrimaryKey.Fingerprint)))
	}
	if len(c.RepositoryKeyFingerprints) == 0 {
		t.Fatalf("repository.asc holds %v, and the endpoint logged no signing key", got)
	}
	for _, want := range c.RepositoryKeyFingerprints {
		if !containsFold(got, want) {
			t.Errorf("repository.asc holds %v, not the signing key the endpoint logged, %s", got, want)
		}
	}
	if key := os.Getenv("PACKAGE_SIGNING_KEY"); key != "" {
		checkSigningKey(t, key, got)
	}
}

// checkSigningKey: the key served is the one the packages are signed with.
func checkSigningKey(t *testing.T, file string, served []string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	keys, err := openpgp.ReadArmoredKeyRing(f)
	if err != nil {
		t.Fatalf("PACKAGE_SIGNING_KEY %s: %v", file, err)
	}
	for _, k := range keys {
		if fp := fmt.Sprintf("%x", k.PrimaryKey.Fingerprint); !containsFold(served, fp) {
			t.Errorf("repository.asc holds %v, not the packages' signing key %s", served, fp)
		}
	}
}

func containsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

// checkDocumentedOptions: the options reached the running process (its
// environment and mounts) and the applied objects.
func checkDocumentedOptions(t *testing.T, c *Cluster, vm *podNetwork) {
	t.Run("extraSources: a package from the operator's volume on 443", func(t *testing.T) {
		_, body := vmGet(t, c, vm, "/install/deb/amd64/istio-sidecar.deb.sha256")
		sum := sha256.Sum256(sidecarPackage)
		if want := hex.EncodeToString(sum[:]) + "  istio-sidecar.deb\n"; string(body) != want {
			t.Errorf("istio-sidecar.deb.sha256 %q, want %q", body, want)
		}
	})
	t.Run("extraEnv in the process", func(t *testing.T) {
		environ, err := c.endpoint.Process("environ")
		if err != nil {
			t.Fatal(err)
		}
		vars := strings.Split(string(environ), "\x00")
		for _, want := range []string{"AWS_REGION=eu-west-1", "EMBARK_POD_NAMESPACE=" + c.Namespace} {
			if !containsFold(vars, want) {
				t.Errorf("the endpoint's environment lacks %s: %q", want, vars)
			}
		}
	})
	t.Run("extraVolumeMounts in the process", func(t *testing.T) {
		mounts, err := c.endpoint.Process("mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(mounts), " /var/run/embark-scratch ") {
			t.Errorf("the endpoint's mounts lack /var/run/embark-scratch:\n%s", mounts)
		}
	})
	t.Run("serviceAccount annotations applied", func(t *testing.T) {
		out, err := c.Env.Kubectl(t.Context(), nil, "get", "sa", "-n", c.Namespace, endpointName,
			"-o", `jsonpath={.metadata.annotations.eks\.amazonaws\.com/role-arn}`)
		if err != nil {
			t.Fatal(err)
		}
		if out != "arn:aws:iam::111122223333:role/embark" {
			t.Errorf("ServiceAccount %s role-arn annotation %q", endpointName, out)
		}
	})
}
