package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/embark-mesh/embark/onboarding/agent"
	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/test/vmsim"
)

// agentFiles are what a test changes in the agent's two configuration
// files (agentConfig); the zero value is an EC2 instance of the world's AWS
// region.
type agentFiles struct {
	// platform is the host section's lines before its aws section, e.g.
	// gceHost's; "" leaves the platform to detection.
	platform string
	// stateDir, when set, is the agent's stateDirectory.
	stateDir string
	// addresses are the workload addresses the agent declares.
	addresses []string
}

// jwtTokenFileHost is the host section of an on-prem host's agent: a JWT
// read from tokenFile.
func jwtTokenFileHost(tokenFile string) string {
	return fmt.Sprintf("  platform: jwt\n  jwt:\n    tokenFile: %s\n", tokenFile)
}

// agentRun is how a test runs the agent library in this process.
type agentRun struct {
	agentFiles
	// debug logs at debug level.
	debug bool
	// renewFraction and sidecarRenewFraction, when not 0, are the agent's.
	renewFraction        float64
	sidecarRenewFraction float64
	// dialOptions are added to the agent's connection to the endpoint.
	dialOptions []grpc.DialOption
}

// runningAgent is the onboarding agent running in this process.
type runningAgent struct {
	root     string            // where its configuration and sidecar files are
	logs     *vmsim.SyncBuffer // its log, shown when the test fails
	platform platform.Platform // the platform it detected
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run returned
	err      error         // what Run returned, once done is closed
}

// runAgent writes the agent's configuration into a new root directory and
// runs the agent library (the platform it detects, 100 ms–1 s back-off)
// until stop or the end of the test.
func (w *world) runAgent(o agentRun) *runningAgent {
	t := w.t
	t.Helper()
	r := &runningAgent{root: t.TempDir(), logs: &vmsim.SyncBuffer{}, done: make(chan struct{})}
	agentFile, onboardingFile := w.agentConfig(r.root, o.agentFiles)
	agentCfg, err := config.LoadAgent(agentFile)
	must(t, err)
	onbCfg, err := config.LoadOnboarding(onboardingFile)
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", r.logs.String())
		}
	})
	level := slog.LevelInfo
	if o.debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: level}))
	r.platform, err = platform.Detect(t.Context(), agentCfg.Host, onbCfg.Audience(), log)
	must(t, err)
	a, err := agent.New(agent.Options{Agent: agentCfg, Onboarding: onbCfg, Platform: r.platform, Version: "v0.0.0-test", Logger: log,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, DialOptions: o.dialOptions,
		RenewFraction: o.renewFraction, SidecarRenewFraction: o.sidecarRenewFraction})
	must(t, err)
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(t.Context())
	go func() {
		r.err = a.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() { _ = r.stop() })
	return r
}

// stop stops the agent (it shuts down) and returns what Run returned once
// it did.
func (r *runningAgent) stop() error {
	r.cancel()
	<-r.done
	return r.err
}

// stopWithin stops the agent and returns what Run returned, or an error
// when it did not return within d.
func (r *runningAgent) stopWithin(d time.Duration) error {
	r.cancel()
	select {
	case <-r.done:
		return r.err
	case <-time.After(d):
		return fmt.Errorf("agent did not stop within %v", d)
	}
}

// agentConfig writes the agent's two configuration files into root: an
// EC2 instance of the world's AWS region unless f says otherwise, its
// sidecar's restart and stop commands appending to root's restarts and
// stops files.
func (w *world) agentConfig(root string, f agentFiles) (agentFile, onboardingFile string) {
	w.t.Helper()
	agentFile, onboardingFile = filepath.Join(root, "agent.config.yaml"), filepath.Join(root, "onboarding.config.yaml")
	state := ""
	if f.stateDir != "" {
		state = "stateDirectory: " + f.stateDir + "\n"
	}
	must(w.t, os.WriteFile(agentFile, []byte(fmt.Sprintf(`apiVersion: config.agent.onboarding.tetrate.io/v1alpha1
kind: AgentConfiguration
%shost:
%s  aws:
    imdsEndpoint: %s
    stsEndpoint: %s
sidecar:
  istio:
    version: 1.30.0
  bootstrap:
    clusterEnv: %[5]s/cluster.env
    meshConfig: %[5]s/mesh.yaml
    rootCert: %[5]s/root-cert.pem
    token: %[5]s/istio-token
  restartCommand: ["/bin/sh", "-c", "echo restart >> %[5]s/restarts"]
  stopCommand: ["/bin/sh", "-c", "echo stop >> %[5]s/stops"]
`, state, f.platform, w.aws.IMDS.URL, w.aws.STS.URL, root)), 0o600))
	var addresses strings.Builder
	if len(f.addresses) > 0 {
		addresses.WriteString("  addresses:\n")
		for _, a := range f.addresses {
			fmt.Fprintf(&addresses, "  - ip: %s\n", a)
		}
	}
	must(w.t, os.WriteFile(onboardingFile, []byte(fmt.Sprintf(`apiVersion: config.agent.onboarding.tetrate.io/v1alpha1
kind: OnboardingConfiguration
onboardingEndpoint:
  host: %s
  tlsServerName: %s
  caCertificates: %s
workload:
  namespace: %s
  name: ratings
  labels:
    host: vm-1
%s`, w.addr, endpointHost, w.caFile, w.ns, addresses.String())), 0o600))
	return agentFile, onboardingFile
}
