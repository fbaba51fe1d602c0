package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/embark-mesh/embark/onboarding/agent"
	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/vmsim"
)

// agentArg is the first argument that runs the demo binary as a simulated
// VM's onboarding agent.
const agentArg = "onboarding-agent"

// runOnboardingAgent is the demo binary run as `demo onboarding-agent
// --agent-config A --onboarding-config O`: the onboarding agent library
// (package onboarding/agent) wired as cmd/onboarding-agent wires it, in a
// process of its own so that a VM can be powered off (killed) without
// unregistering.
func runOnboardingAgent(args []string) int {
	fs := flag.NewFlagSet(agentArg, flag.ContinueOnError)
	agentFile := fs.String("agent-config", "", "agent configuration file")
	onboardingFile := fs.String("onboarding-config", "", "onboarding configuration file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := func() error {
		agentCfg, err := config.LoadAgent(*agentFile)
		if err != nil {
			return err
		}
		onbCfg, err := config.LoadOnboarding(*onboardingFile)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		plat, err := platform.Detect(ctx, agentCfg.Host, onbCfg.Audience(), log)
		if err != nil {
			return err
		}
		a, err := agent.New(agent.Options{Agent: agentCfg, Onboarding: onbCfg, Platform: plat, Version: "v0.1.0-demo", Logger: log,
			MinBackoff: 500 * time.Millisecond, MaxBackoff: 5 * time.Second})
		if err != nil {
			return err
		}
		return a.Run(ctx)
	}()
	if err != nil {
		fmt.Fprintf(os.Stderr, "onboarding-agent: %v\n", err)
		return 1
	}
	return 0
}

// Paths inside a VM's root directory, as on a VM (the onboarding agent's
// defaults), except the root certificate of the discovery address: the
// file-mounted workload certificates pilot-agent reads live in etc/certs.
const (
	vmClusterEnv  = vmsim.ClusterEnv
	vmMeshConfig  = vmsim.MeshConfig
	vmRootCert    = vmsim.RootCert
	vmToken       = vmsim.Token
	vmUnitSocket  = vmsim.UnitSocket
	vmAgentLog    = "var/log/onboarding-agent.log"
	vmAgentConfig = "etc/onboarding-agent/agent.config.yaml"
	vmOnbConfig   = "etc/onboarding-agent/onboarding.config.yaml"
)

// agentSettings are what the demo tells each VM's onboarding agent.
type agentSettings struct {
	exe        string // the demo binary
	endpoint   string // onboarding API address
	serverName string
	caFile     string // demo CA the VM trusts
	stsURL     string
}

// startAgent prepares the VM's root directory (the agent's configuration),
// serves its sidecar unit, and starts its onboarding agent.
func (v *vm) startAgent(t *demoTB, s agentSettings) error {
	v.settings = s
	p := func(rel string) string { return filepath.Join(v.root, rel) }
	agentCfg := fmt.Sprintf(`apiVersion: %s
kind: %s
host:
  platform: aws
  aws:
    imdsEndpoint: %s
    stsEndpoint: %s
sidecar:
  istio:
    version: 1.31-dev
  bootstrap:
    clusterEnv: %s
    meshConfig: %s
    rootCert: %s
    token: %s
  restartCommand: [%q, %s, --socket, %q, restart]
  stopCommand: [%q, %s, --socket, %q, stop]
`, config.APIVersion, config.AgentKind, v.imds.URL, s.stsURL, p(vmClusterEnv), p(vmMeshConfig), p(vmRootCert), p(vmToken),
		s.exe, systemctlArg, p(vmUnitSocket), s.exe, systemctlArg, p(vmUnitSocket))
	onbCfg := fmt.Sprintf(`apiVersion: %s
kind: %s
onboardingEndpoint:
  host: %s
  tlsServerName: %s
  caCertificates: %s
workload:
  namespace: bookinfo
  name: ratings
  labels:
    version: v5
`, config.APIVersion, config.OnboardingKind, s.endpoint, s.serverName, s.caFile)
	for _, f := range []struct{ path, data string }{{p(vmAgentConfig), agentCfg}, {p(vmOnbConfig), onbCfg}} {
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f.path, []byte(f.data), 0o644); err != nil {
			return err
		}
	}
	for _, d := range []string{filepath.Dir(p(vmUnitSocket)), filepath.Dir(p(vmAgentLog))} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	unit, err := vmsim.StartUnit(p(vmUnitSocket), func() error { return v.restartSidecar(t) }, func() error { v.stopSidecar(); return nil })
	if err != nil {
		return err
	}
	v.unit = unit
	logFile, err := os.Create(p(vmAgentLog))
	if err != nil {
		return err
	}
	cmd := exec.Command(s.exe, agentArg, "--agent-config", p(vmAgentConfig), "--onboarding-config", p(vmOnbConfig))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start the onboarding agent: %w", err)
	}
	v.agent = cmd
	v.agentDone = make(chan error, 1)
	go func() {
		err := cmd.Wait()
		_ = logFile.Close()
		v.agentDone <- err
	}()
	return nil
}

// restartSidecar is the unit's restart: stop pilot-agent if it runs, then
// start it in the VM's root from the files the onboarding agent wrote
// (cluster.env as its environment, the mesh config's ProxyConfig, the token
// file where pilot-agent reads it), and play Envoy's part.
func (v *vm) restartSidecar(t *demoTB) error {
	v.stopSidecar()
	envData, err := os.ReadFile(filepath.Join(v.root, vmClusterEnv))
	if err != nil {
		return err
	}
	env, err := parseClusterEnv(envData)
	if err != nil {
		return err
	}
	meshData, err := os.ReadFile(filepath.Join(v.root, vmMeshConfig))
	if err != nil {
		return err
	}
	pc, err := vmsim.ProxyConfig(meshData)
	if err != nil {
		return err
	}
	pc.ControlPlaneAuthPolicy = meshconfig.AuthenticationPolicy_MUTUAL_TLS
	// The roots the sidecar verifies Embark's xDS server with come from the
	// bootstrap the endpoint returned (mesh.rootCertFile), as the agent wrote them.
	rootCA, err := os.ReadFile(filepath.Join(v.root, vmRootCert))
	if err != nil {
		return err
	}
	if len(rootCA) == 0 {
		return fmt.Errorf("the onboarding agent wrote an empty %s: the endpoint sent no root certificates", vmRootCert)
	}
	for k, val := range sidecarEnv(v.root) {
		env[k] = val
	}
	a := istioagent.Start(t, istioagent.Options{
		WorkDir:        v.root,
		PodName:        env["POD_NAME"],
		PodNamespace:   env["POD_NAMESPACE"],
		InstanceIP:     env["INSTANCE_IP"],
		ClusterID:      env["ISTIO_META_CLUSTER_ID"],
		ServiceAccount: env["SERVICE_ACCOUNT"],
		Env:            env,
		ProxyConfig:    pc,
		XDSRootCA:      rootCA,
		IstiodSAN:      v.settings.serverName,
	})
	v.mu.Lock()
	v.sidecar, v.registration = a, env["POD_NAME"]
	v.restarts++
	v.mu.Unlock()
	return v.connectEnvoy(context.Background())
}

// powerOff kills the VM's onboarding agent (no unregistering) and stops its
// sidecar: the VM is gone without a word.
func (v *vm) powerOff() error {
	if v.agent == nil {
		return errors.New("no onboarding agent runs")
	}
	_ = v.agent.Process.Kill()
	<-v.agentDone
	v.agent = nil
	v.stopSidecar()
	return nil
}

// shutdownAgent stops the onboarding agent gracefully (it unregisters and
// stops the sidecar through the unit), then the unit.
func (v *vm) shutdownAgent() {
	if v.agent != nil {
		_ = v.agent.Process.Signal(syscall.SIGTERM)
		select {
		case <-v.agentDone:
		case <-time.After(20 * time.Second):
			_ = v.agent.Process.Kill()
			<-v.agentDone
		}
		v.agent = nil
	}
	if v.unit != nil {
		v.unit.Close()
		v.unit = nil
	}
	v.stopSidecar()
}

// agentLog returns the lines of the VM's onboarding agent log that contain
// any of words.
func (v *vm) agentLog(words ...string) string {
	b, err := os.ReadFile(filepath.Join(v.root, vmAgentLog))
	if err != nil {
		return ""
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
