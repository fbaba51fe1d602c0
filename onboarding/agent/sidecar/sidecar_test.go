package sidecar

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

func testBootstrap() *onboardingv1alpha1.SidecarBootstrap {
	return &onboardingv1alpha1.SidecarBootstrap{
		DiscoveryAddress: "onboarding.example:15012",
		ClusterId:        "Kubernetes",
		Network:          "virtual-machines",
		ServiceAccount:   "ratings-vm",
		TrustDomain:      "cluster.local",
		Labels:           map[string]string{"app": "ratings", "version": "v5", "quote": "it's"},
		InstanceIp:       "172.31.5.254",
		ProxyConfigJson:  `{"discoveryAddress":"onboarding.example:15012","readinessProbe":{"httpGet":{"path":"/ready","port":8080},"periodSeconds":5}}`,
		RootCertificates: []byte("-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n"),
		SidecarToken:     "sidecar.jwt.token",
	}
}

func TestClusterEnvDNS(t *testing.T) {
	tests := []struct {
		name     string
		opts     EnvOptions
		want     []string
		wantNone []string
	}{
		{"off", EnvOptions{}, nil, []string{"ISTIO_META_DNS_CAPTURE=", "DNS_PROXY_ADDR=", "ISTIO_META_DNS_AUTO_ALLOCATE="}},
		{"on", EnvOptions{DNSAddress: "127.0.0.1:15053"},
			[]string{"ISTIO_META_DNS_CAPTURE='true'\n", "DNS_PROXY_ADDR='127.0.0.1:15053'\n"}, []string{"ISTIO_META_DNS_AUTO_ALLOCATE="}},
		{"auto-allocate", EnvOptions{DNSAddress: "127.0.0.2:5353", DNSAutoAllocate: true},
			[]string{"ISTIO_META_DNS_CAPTURE='true'\n", "DNS_PROXY_ADDR='127.0.0.2:5353'\n", "ISTIO_META_DNS_AUTO_ALLOCATE='true'\n"}, nil},
		{"auto-allocate without the proxy", EnvOptions{DNSAutoAllocate: true}, nil, []string{"ISTIO_META_DNS_CAPTURE=", "ISTIO_META_DNS_AUTO_ALLOCATE="}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, err := ClusterEnv(Identity{Namespace: "ns", RegistrationName: "vm"}, testBootstrap(), tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(env), w) {
					t.Errorf("cluster.env lacks %q:\n%s", w, env)
				}
			}
			for _, w := range tt.wantNone {
				if strings.Contains(string(env), w) {
					t.Errorf("cluster.env sets %q:\n%s", w, env)
				}
			}
			// The root-run installer admits what ClusterEnv renders.
			if _, err := ParseClusterEnv(env); err != nil {
				t.Errorf("ParseClusterEnv refuses the rendered cluster.env: %v", err)
			}
		})
	}
}

func TestWriteBootstrap(t *testing.T) {
	dir := t.TempDir()
	f := &Files{Paths: config.BootstrapFiles{
		ClusterEnv: filepath.Join(dir, "var/lib/istio/envoy/cluster.env"),
		MeshConfig: filepath.Join(dir, "etc/istio/config/mesh"),
		RootCert:   filepath.Join(dir, "etc/certs/embark-root-cert.pem"),
		Token:      filepath.Join(dir, "var/run/secrets/tokens/istio-token"),
	}, Env: EnvOptions{Revision: "canary"}}
	if err := f.Write(Identity{Namespace: "bookinfo", RegistrationName: "ratings-x"}, testBootstrap()); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	env := read(f.Paths.ClusterEnv)
	for _, want := range []string{"POD_NAME='ratings-x'\n", "POD_NAMESPACE='bookinfo'\n", "INSTANCE_IP='172.31.5.254'\n", "ISTIO_META_NETWORK='virtual-machines'\n",
		"ISTIO_REVISION='canary'\n",
		"PILOT_ADDRESS='onboarding.example:15012'\n", "XDS_ROOT_CA='" + f.Paths.RootCert + "'\n", "CA_ROOT_CA='" + f.Paths.RootCert + "'\n", "ISTIO_SVC_IP='172.31.5.254'\n",
		"ISTIO_NAMESPACE='bookinfo'\n", "ISTIO_CUSTOM_IP_TABLES='true'\n", "ISTIO_INBOUND_INTERCEPTION_MODE='NONE'\n", "ISTIO_META_INTERCEPTION_MODE='NONE'\n", `ISTIO_METAJSON_LABELS='{"app":"ratings","quote":"it'\''s","version":"v5"}'` + "\n", "SERVICE_ACCOUNT='ratings-vm'\n"} {
		if !strings.Contains(env, want) {
			t.Errorf("cluster.env lacks %q:\n%s", want, env)
		}
	}
	// CA_ADDR unset: istio-start.sh and pilot-agent default it to the
	// discovery address, where Embark relays istiod's certificate service.
	if strings.Contains(env, "CA_ADDR=") {
		t.Errorf("cluster.env sets CA_ADDR without sidecar.caAddress:\n%s", env)
	}
	var mesh struct {
		DefaultConfig struct {
			DiscoveryAddress string         `json:"discoveryAddress"`
			ReadinessProbe   map[string]any `json:"readinessProbe"`
		} `json:"defaultConfig"`
	}
	if err := yaml.UnmarshalStrict([]byte(read(f.Paths.MeshConfig)), &mesh); err != nil {
		t.Fatal(err)
	}
	if mesh.DefaultConfig.DiscoveryAddress != "onboarding.example:15012" || mesh.DefaultConfig.ReadinessProbe["httpGet"] == nil {
		t.Errorf("mesh config %+v", mesh)
	}
	if read(f.Paths.Token) != "sidecar.jwt.token" || !strings.Contains(read(f.Paths.RootCert), "root") {
		t.Error("token or root certificate not written")
	}
	if err := f.WriteToken("renewed"); err != nil {
		t.Fatal(err)
	}
	if read(f.Paths.Token) != "renewed" {
		t.Error("token not replaced")
	}
	entries, _ := os.ReadDir(filepath.Dir(f.Paths.Token))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestWriteAtomicKeepsTheOldFileOnFailure(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "token")
	if err := WriteAtomic(p, []byte("good"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A directory in the way of the temporary file's rename target.
	if err := WriteAtomic(dir, []byte("x"), 0o600); err == nil {
		t.Error("renaming over a directory succeeded")
	}
	if b, _ := os.ReadFile(p); string(b) != "good" {
		t.Errorf("old content lost: %q", b)
	}
}

func TestBadProxyConfigIsAnError(t *testing.T) {
	boot := testBootstrap()
	boot.ProxyConfigJson = "{"
	if _, err := MeshConfig(boot); err == nil {
		t.Error("bad ProxyConfig accepted")
	}
}

func TestRun(t *testing.T) {
	if err := Run(t.Context(), []string{"/bin/sh", "-c", "exit 0"}); err != nil {
		t.Fatal(err)
	}
	err := Run(t.Context(), []string{"/bin/sh", "-c", "echo unit not found; exit 5"})
	if err == nil || !strings.Contains(err.Error(), "unit not found") {
		t.Errorf("error %v does not carry the output", err)
	}
}
