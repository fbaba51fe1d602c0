package rollout

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/embark-mesh/embark/onboarding/agent"
	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/vmsim"
)

// Paths inside a VM's root directory, as on a VM (the onboarding agent's
// defaults); pilot-agent runs with the root as its working directory, so
// it finds the token where the agent writes it.
const (
	vmClusterEnv = vmsim.ClusterEnv
	vmMeshConfig = vmsim.MeshConfig
	vmRootCert   = vmsim.RootCert
	vmToken      = vmsim.Token
	vmUnitSocket = vmsim.UnitSocket
)

// vm is one simulated EC2 instance: its IMDS, its application (an HTTP
// server on its own loopback address whose /ready the group's probe
// checks), its onboarding agent (the real library, in this process), and
// the sidecar unit that runs pilot-agent when the agent restarts it.
type vm struct {
	t    *testing.T
	name string // the test's name for it, e.g. vm-03
	imds *awstest.IMDS
	ip   string
	root string
	note func(format string, args ...any)

	app *vmsim.App
	// breakOnRestart makes the next sidecar restart (a re-onboarding: the
	// application's new version) unhealthy.
	breakOnRestart atomic.Bool

	logs      *vmsim.SyncBuffer
	unit      *vmsim.Unit
	stopAgent context.CancelFunc
	agentDone chan error

	mu        sync.Mutex
	restarts  int
	sidecar   *istioagent.Agent
	stopEnvoy context.CancelFunc
	envoy     *istioagent.Client
}

// vmSettings are what every VM's onboarding agent is told.
type vmSettings struct {
	endpoint string // onboarding API address
	caFile   string // the endpoint's CA
	stsURL   string
	appPort  int
	ns       string // the WorkloadGroup's namespace
}

// start starts the VM's application, its sidecar unit and its onboarding
// agent.
func (v *vm) start(s vmSettings) {
	t := v.t
	t.Helper()
	var err error
	// Not t.TempDir(): unix socket paths are limited to 107 bytes.
	v.root, err = os.MkdirTemp("", "wgr-"+v.name+"-")
	must(t, err)
	p := func(rel string) string { return filepath.Join(v.root, rel) }

	v.app, err = vmsim.StartApp(v.ip, s.appPort, "ratings on "+v.name)
	must(t, err)
	must(t, os.MkdirAll(filepath.Dir(p(vmUnitSocket)), 0o755))
	v.unit, err = vmsim.StartUnit(p(vmUnitSocket), v.restartSidecar, func() error { v.stopSidecar(); return nil })
	must(t, err)

	exe, err := os.Executable()
	must(t, err)
	agentFile, onbFile := p("etc/onboarding-agent/agent.config.yaml"), p("etc/onboarding-agent/onboarding.config.yaml")
	must(t, os.MkdirAll(filepath.Dir(agentFile), 0o755))
	must(t, os.WriteFile(agentFile, []byte(fmt.Sprintf(`apiVersion: %s
kind: %s
host:
  platform: aws
  aws:
    imdsEndpoint: %s
    stsEndpoint: %s
sidecar:
  istio:
    version: 1.30.0
  bootstrap:
    clusterEnv: %s
    meshConfig: %s
    rootCert: %s
    token: %s
  restartCommand: [%q, %s, %q, restart]
  stopCommand: [%q, %s, %q, stop]
`, config.APIVersion, config.AgentKind, v.imds.URL, s.stsURL, p(vmClusterEnv), p(vmMeshConfig), p(vmRootCert), p(vmToken),
		exe, systemctlArg, p(vmUnitSocket), exe, systemctlArg, p(vmUnitSocket))), 0o600))
	must(t, os.WriteFile(onbFile, []byte(fmt.Sprintf(`apiVersion: %s
kind: %s
onboardingEndpoint:
  host: %s
  tlsServerName: %s
  caCertificates: %s
workload:
  namespace: %s
  name: ratings
`, config.APIVersion, config.OnboardingKind, s.endpoint, endpointHost, s.caFile, s.ns)), 0o600))
	agentCfg, err := config.LoadAgent(agentFile)
	must(t, err)
	onbCfg, err := config.LoadOnboarding(onbFile)
	must(t, err)
	v.logs = &vmsim.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(v.logs, nil)).With("vm", v.name)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	plat, err := platform.Detect(ctx, agentCfg.Host, onbCfg.Audience(), log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	a, err := agent.New(agent.Options{Agent: agentCfg, Onboarding: onbCfg, Platform: plat, Version: "v0.0.0-rollout-test", Logger: log,
		MinBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	v.stopAgent, v.agentDone = cancel, make(chan error, 1)
	go func() { v.agentDone <- a.Run(ctx) }()
}

// shutdown stops the onboarding agent gracefully (it unregisters and stops
// the sidecar through the unit), then the unit and the application, and
// removes the VM's root.
func (v *vm) shutdown() {
	if v.root != "" {
		defer func() { _ = os.RemoveAll(v.root) }()
	}
	if v.stopAgent != nil {
		v.stopAgent()
		select {
		case err := <-v.agentDone:
			if err != nil {
				v.t.Errorf("%s: onboarding agent: %v", v.name, err)
			}
		case <-time.After(30 * time.Second):
			v.t.Errorf("%s: onboarding agent did not stop", v.name)
		}
		v.stopAgent = nil
	}
	if v.unit != nil {
		v.unit.Close()
		v.unit = nil
	}
	v.stopSidecar()
	if v.app != nil {
		v.app.Close()
	}
}

// restartSidecar is the unit's restart: stop pilot-agent if it runs, then
// start it in the VM's root from the files the onboarding agent wrote
// (cluster.env as its environment, the mesh config's ProxyConfig with the
// group's readiness probe, the token file), and play Envoy's part.
func (v *vm) restartSidecar() error {
	v.stopSidecar()
	if v.breakOnRestart.Load() {
		v.app.SetHealthy(false)
		v.note("%s: its application's new version fails /ready", v.name)
	}
	opts, err := vmsim.SidecarOptions(v.root, endpointHost)
	if err != nil {
		return err
	}
	a := istioagent.Start(vmsim.FatalTB{TB: v.t}, opts)
	ctx, cancel := context.WithCancel(context.WithoutCancel(v.t.Context()))
	c, err := istioagent.Connect(ctx, a)
	if err != nil {
		cancel()
		a.Stop()
		return err
	}
	for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
		if err := c.Send(typ, nil, "", ""); err != nil {
			cancel()
			a.Stop()
			return err
		}
	}
	go func() {
		for {
			resp, err := c.Recv(ctx)
			if err != nil || c.ACK(resp) != nil {
				return
			}
		}
	}()
	v.mu.Lock()
	v.sidecar, v.envoy, v.stopEnvoy = a, c, cancel
	v.restarts++
	v.mu.Unlock()
	return nil
}

// stopSidecar stops pilot-agent and the Envoy stand-in.
func (v *vm) stopSidecar() {
	v.mu.Lock()
	stopEnvoy, envoy, sc := v.stopEnvoy, v.envoy, v.sidecar
	v.stopEnvoy, v.envoy, v.sidecar = nil, nil, nil
	v.mu.Unlock()
	if stopEnvoy != nil {
		stopEnvoy()
		_ = envoy.Close()
	}
	if sc != nil {
		sc.Stop()
	}
}

func (v *vm) sidecarRestarts() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.restarts
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
