package xds

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
)

// age matches the " (3s)" istioctl appends to a status.
var age = regexp.MustCompile(` \([0-9a-z.]+\)`)

// TestRealSidecarAndIstioctl runs Istio's own pilot-agent (without Envoy) as
// the workload's sidecar with the bound token from registration, and
// Istio's own istioctl against the debug listener.
func TestRealSidecarAndIstioctl(t *testing.T) {
	r := startReplica(t, "replica-a", nil)
	ns := env.Namespace(t)
	w := register(t, ns, "i-0000000000000000a", "10.0.7.1")
	i := sharedIstiod(t)
	agent := istioagent.Start(t, withIstiodCA(i, istioagent.Options{
		DiscoveryAddress: r.addr,
		PodName:          w.key.Name,
		PodNamespace:     ns,
		InstanceIP:       w.ip,
		ClusterID:        certClusterID,
		ServiceAccount:   fixtures.ServiceAccount,
		Token:            w.token,
	}))
	checkCertificate(t, agent, i, ns, fixtures.ServiceAccount)
	c, err := istioagent.Connect(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Send(resource.ListenerType, nil, "", ""); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Recv(t.Context())
	if err != nil {
		t.Fatalf("no listeners through pilot-agent: %v\n%s", err, agent.Logs())
	}
	if err := c.ACK(resp); err != nil {
		t.Fatal(err)
	}
	waitState(t, w.key, connected("replica-a"))

	out, err := istioagent.Istioctl(t.Context(), t, "proxy-status", "--xds-address", r.debugAddr, "--plaintext", "-r", "default")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("istioctl proxy-status:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want a header and one proxy:\n%s", out)
	}
	for _, want := range []string{w.key.Name + "." + ns, "vm-cluster", "replica-a"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("proxy-status row %q lacks %q", lines[1], want)
		}
	}
	// Per type: LDS was sent and ACKed through pilot-agent, the rest never sent.
	out, err = istioagent.Istioctl(t.Context(), t, "proxy-status", "--xds-address", r.debugAddr, "--plaintext", "-r", "default", "-v", "1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("istioctl proxy-status -v 1:\n%s", out)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want a header and one proxy:\n%s", out)
	}
	header, row := strings.Fields(lines[0]), strings.Fields(age.ReplaceAllString(strings.ReplaceAll(lines[1], "NOT SENT", "NOT_SENT"), ""))
	for i, col := range header {
		want := map[string]string{"LDS": "SYNCED", "CDS": "NOT_SENT", "EDS": "NOT_SENT", "RDS": "NOT_SENT"}[col]
		if want != "" && (i >= len(row) || !strings.HasPrefix(row[i], want)) {
			t.Errorf("column %s: row %v, want %s", col, row, want)
		}
	}

	agent.Stop()
	waitState(t, w.key, disconnected("replica-a"))
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if out, err = istioagent.Istioctl(t.Context(), t, "proxy-status", "--xds-address", r.debugAddr, "--plaintext", "-r", "default"); err == nil && !strings.Contains(out, w.key.Name) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("a disconnected workload is still listed (%v):\n%s", err, out)
}
