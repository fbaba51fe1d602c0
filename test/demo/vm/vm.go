// Package vm simulates the demo's VMs: an EC2 instance (its IMDS on
// loopback), an ECS task, a Compute Engine instance or an Azure VM (their
// metadata servers on loopback) or an on-prem host (a JWT from a credential
// command), each with
// its application, its sidecar unit, and its real onboarding agent in a
// process of its own (the demo binary run as `demo onboarding-agent`,
// RunAgent), which onboards, writes the sidecar's bootstrap and restarts
// the sidecar through the unit (the demo binary run as `demo systemctl`,
// Systemctl): Istio's real pilot-agent, without Envoy, whose part the VM
// plays on pilot-agent's XDS socket (PlayEnvoy). The parts shared with the
// tests (application, unit, sidecar files) are test/vmsim's.
package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"google.golang.org/grpc/metadata"
	"k8s.io/apimachinery/pkg/types"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/test/vmsim"
)

// Paths inside a VM's root directory besides vmsim's: the onboarding
// agent's configuration and log, and where pilot-agent writes the
// workload certificate it got (OUTPUT_CERTS): with Envoy it would serve it
// over SDS only; without Envoy (DISABLE_ENVOY=true) it serves no SDS
// socket, so the demo reads the files.
const (
	AgentLogFile = "var/log/onboarding-agent.log"
	agentConfig  = "etc/onboarding-agent/agent.config.yaml"
	onbConfig    = "etc/onboarding-agent/onboarding.config.yaml"
	OutputCerts  = "etc/istio/output-certs"
)

// VM is one simulated VM.
type VM struct {
	Name string        // the demo's name for it, e.g. ratings-1
	IMDS *awstest.IMDS // an EC2 instance's; nil for any other workload
	// PlatformIP is the address the platform's metadata proves for a
	// workload that is not an EC2 instance (an ECS task's ENI, a GCE or
	// Azure VM's network interface).
	PlatformIP string
	App        *vmsim.App
	// Root is the VM's root directory: its onboarding agent's configuration
	// and log, the sidecar files the agent writes, pilot-agent's working
	// directory.
	Root string
	// UID is a registration it must no longer be (re-onboarding).
	UID types.UID
	// ResolvConf, when set, is the /etc/resolv.conf its pilot-agent reads:
	// the VM's usual resolver, to which the sidecar's DNS proxy forwards
	// the names outside the mesh. Nil: this machine's.
	ResolvConf []byte

	// BeforeRestart, when set, runs on each sidecar restart by the
	// onboarding agent, after the old sidecar stopped and before the new
	// one starts: where a test changes the VM as its new version arrives
	// (an application that fails its probe).
	BeforeRestart func()

	settings  Settings
	tb        testing.TB
	unit      *vmsim.Unit
	agent     *exec.Cmd          // the agent's process; nil when it runs in this process
	stopAgent context.CancelFunc // stops the agent that runs in this process
	agentDone chan error

	mu           sync.Mutex // guards the fields below (the unit runs commands concurrently with the steps)
	registration string     // name of its WorkloadAutoRegistration, from the sidecar's bootstrap
	restarts     int        // sidecar restarts by the onboarding agent
	sidecar      *istioagent.Agent
	envoy        *istioagent.Client
	stopEnvoy    context.CancelFunc
	eds          *edsLog // what the sidecar was sent over EDS, kept across restarts
}

// Reg returns the name of the VM's registration.
func (v *VM) Reg() string {
	name, _ := v.State()
	return name
}

// IP returns the VM's workload address: an EC2 instance's private IP, the
// address an on-prem host's agent declares, or PlatformIP.
func (v *VM) IP() string {
	switch {
	case v.IMDS != nil:
		return v.IMDS.Instance().PrivateIP
	case v.settings.Address != "":
		return v.settings.Address
	}
	return v.PlatformIP
}

// State returns the VM's registration name and its sidecar restarts so far.
func (v *VM) State() (string, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.registration, v.restarts
}

// Sidecar returns the VM's running pilot-agent, nil when none runs.
func (v *VM) Sidecar() *istioagent.Agent {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.sidecar
}

// DNSAddr returns where the VM's running pilot-agent's DNS proxy listens
// (its DNS_PROXY_ADDR): the address in cluster.env on a VM of its own; here,
// where the VMs share this machine's loopback, a port of its own
// (test/vmsim). "" when no sidecar runs or its DNS proxy is off.
func (v *VM) DNSAddr() string {
	a := v.Sidecar()
	if a == nil {
		return ""
	}
	return a.Options().Env["DNS_PROXY_ADDR"]
}

// StartApp starts the VM's application on ip (a loopback address) and port.
func (v *VM) StartApp(ip string, port int) error {
	app, err := vmsim.StartApp(ip, port, "ratings on "+v.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", v.Name, err)
	}
	v.App = app
	return nil
}

// Onboard does, once, what the onboarding agent on an EC2 instance does:
// read the platform credential from IMDS (document, signature, a signed STS
// request for audience), get an onboarding token (Authorize) and register
// (Register).
func (v *VM) Onboard(ctx context.Context, api onboardingv1alpha1.OnboardingServiceClient, stsURL, audience string) (*onboardingv1alpha1.RegisterResponse, error) {
	ic := imds.New(imds.Options{Endpoint: v.IMDS.URL})
	sc := awsclient.NewSTSClient(ic, v.IMDS.Instance().Region, func(o *sts.Options) { o.BaseEndpoint = &stsURL })
	cred, err := awsclient.Credential(ctx, ic, sc, audience)
	if err != nil {
		return nil, fmt.Errorf("read the platform credential: %w", err)
	}
	auth, err := api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: "bookinfo", Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: awswire.ToProto(cred)},
	})
	if err != nil {
		return nil, err
	}
	return api.Register(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
		Addresses:           []*onboardingv1alpha1.HostAddress{{Ip: v.IMDS.Instance().PrivateIP, Type: "VPC"}},
		ConnectedOver:       "VPC",
		AgentVersion:        "v0.1.0-demo",
		IstioSidecarVersion: "1.30-dev",
		Labels:              map[string]string{"version": "v5"},
	})
}

// Settings are what the demo tells each VM's onboarding agent.
type Settings struct {
	Exe        string // the demo binary
	Endpoint   string // onboarding API address
	ServerName string
	CAFile     string // demo CA the VM trusts
	// Host is the host section of the agent's configuration (AWSHost or
	// JWTHost).
	Host string
	// Address is the workload address the agent declares ("": the
	// platform's).
	Address string
	// Env is added to the agent's environment, e.g. what ECS gives a task's
	// containers.
	Env []string
	// Namespace is the WorkloadGroup's namespace ("": bookinfo); the group
	// is ratings.
	Namespace string
	// Labels are the workload labels the agent declares.
	Labels map[string]string
	// IstioVersion is the sidecar's Istio version in the agent's
	// configuration ("": 1.31-dev).
	IstioVersion string
	// InProcess, when set, runs the onboarding agent in this process (the
	// library, as a test runs it) instead of as `Exe onboarding-agent`; Exe
	// still runs as the agent's systemctl. Such a VM cannot be powered off.
	InProcess *InProcess
}

// InProcess is how an onboarding agent in this process runs: the version
// it reports and its retry back-off.
type InProcess struct {
	Version    string
	MinBackoff time.Duration
	MaxBackoff time.Duration
}

// AWSHost is the host section of an EC2 instance's agent: the platform
// credential from its IMDS and the STS at stsURL.
func (v *VM) AWSHost(stsURL string) string {
	return fmt.Sprintf(`  platform: aws
  aws:
    imdsEndpoint: %s
    stsEndpoint: %s
`, v.IMDS.URL, stsURL)
}

// ECSHost is the host section of an ECS task's agent: the platform is
// detected from the task's environment (Settings.Env), its STS proof sent
// to the STS at stsURL.
func ECSHost(stsURL string) string {
	return fmt.Sprintf("  aws:\n    stsEndpoint: %s\n", stsURL)
}

// GCEHost is the host section of a Compute Engine instance's agent: the
// instance identity token from the metadata server at url.
func GCEHost(url string) string {
	return fmt.Sprintf("  platform: gce\n  gce:\n    metadataEndpoint: %s\n", url)
}

// AzureHost is the host section of an Azure VM's agent: the managed
// identity token for resource from the Instance Metadata Service at url.
func AzureHost(url, resource string) string {
	return fmt.Sprintf("  platform: azure\n  azure:\n    imdsEndpoint: %s\n    resource: %s\n", url, resource)
}

// JWTHost is the host section of an on-prem host's agent: a JWT that
// command prints.
func JWTHost(command string) string {
	return fmt.Sprintf("  platform: jwt\n  jwt:\n    command: %s\n", command)
}

// StartAgent prepares the VM's root directory (the agent's configuration),
// serves its sidecar unit, and starts its onboarding agent; t is where the
// sidecars' test helpers report (its Fatalf must panic with vmsim.Fatal:
// a step.TB or a vmsim.FatalTB).
func (v *VM) StartAgent(t testing.TB, s Settings) error {
	v.settings, v.tb = s, t
	if err := v.writeAgentConfig(s); err != nil {
		return err
	}
	p := func(rel string) string { return filepath.Join(v.Root, rel) }
	for _, d := range []string{filepath.Dir(p(vmsim.UnitSocket)), filepath.Dir(p(AgentLogFile))} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	unit, err := vmsim.StartUnit(p(vmsim.UnitSocket), func() error { return v.restartSidecar(t) }, func() error { v.stopSidecar(); return nil })
	if err != nil {
		return err
	}
	v.unit = unit
	logFile, err := os.Create(p(AgentLogFile))
	if err != nil {
		return err
	}
	if s.InProcess != nil {
		v.runAgentInProcess(t, logFile, *s.InProcess)
		return nil
	}
	return v.startAgentProcess(s, logFile)
}

// writeAgentConfig writes the onboarding agent's two configuration files
// into the VM's root.
func (v *VM) writeAgentConfig(s Settings) error {
	p := func(rel string) string { return filepath.Join(v.Root, rel) }
	istioVersion, ns := s.IstioVersion, s.Namespace
	if istioVersion == "" {
		istioVersion = "1.31-dev"
	}
	if ns == "" {
		ns = "bookinfo"
	}
	agentCfg := fmt.Sprintf(`apiVersion: %s
kind: %s
host:
%ssidecar:
  istio:
    version: %s
  bootstrap:
    clusterEnv: %s
    meshConfig: %s
    rootCert: %s
    token: %s
  restartCommand: [%q, %s, --socket, %q, restart]
  stopCommand: [%q, %s, --socket, %q, stop]
`, agentAPIVersion, agentKind, s.Host, istioVersion, p(vmsim.ClusterEnv), p(vmsim.MeshConfig), p(vmsim.RootCert), p(vmsim.Token),
		s.Exe, SystemctlArg, p(vmsim.UnitSocket), s.Exe, SystemctlArg, p(vmsim.UnitSocket))
	addresses := ""
	if s.Address != "" {
		addresses = fmt.Sprintf("  addresses:\n  - ip: %s\n", s.Address)
	}
	onbCfg := fmt.Sprintf(`apiVersion: %s
kind: %s
onboardingEndpoint:
  host: %s
  tlsServerName: %s
  caCertificates: %s
workload:
  namespace: %s
  name: ratings
%s%s`, agentAPIVersion, onboardingKind, s.Endpoint, s.ServerName, s.CAFile, ns, addresses, labelsYAML(s.Labels))
	for _, f := range []struct{ path, data string }{{p(agentConfig), agentCfg}, {p(onbConfig), onbCfg}} {
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f.path, []byte(f.data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// labelsYAML is the workload section's labels, sorted; "" for none.
func labelsYAML(labels map[string]string) string {
	if len(labels) == 0 {
		return ""
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("  labels:\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "    %s: %s\n", k, labels[k])
	}
	return b.String()
}

// startAgentProcess starts the onboarding agent as `Exe onboarding-agent`,
// logging to logFile.
func (v *VM) startAgentProcess(s Settings, logFile *os.File) error {
	p := func(rel string) string { return filepath.Join(v.Root, rel) }
	cmd := exec.Command(s.Exe, AgentArg, "--agent-config", p(agentConfig), "--onboarding-config", p(onbConfig))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if len(s.Env) > 0 {
		cmd.Env = append(os.Environ(), s.Env...)
	}
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

// runAgentInProcess runs the onboarding agent library in this process
// until Shutdown, logging to logFile.
func (v *VM) runAgentInProcess(t testing.TB, logFile *os.File, o InProcess) {
	p := func(rel string) string { return filepath.Join(v.Root, rel) }
	log := slog.New(slog.NewTextHandler(logFile, nil)).With("vm", v.Name)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	v.stopAgent, v.agentDone = cancel, make(chan error, 1)
	go func() {
		err := runAgent(ctx, p(agentConfig), p(onbConfig), log, o)
		_ = logFile.Close()
		v.agentDone <- err
	}()
}

// restartSidecar is the unit's restart: stop pilot-agent if it runs, then
// start it in the VM's root from the files the onboarding agent wrote
// (cluster.env as its environment, the mesh config's ProxyConfig, the token
// file where pilot-agent reads it; the roots it verifies Embark's xDS
// server with come from the bootstrap the endpoint returned), and play
// Envoy's part.
func (v *VM) restartSidecar(t testing.TB) error {
	v.stopSidecar()
	if v.BeforeRestart != nil {
		v.BeforeRestart()
	}
	opts, err := vmsim.SidecarOptions(v.Root, v.settings.ServerName)
	if err != nil {
		return err
	}
	opts.Env["OUTPUT_CERTS"] = filepath.Join(v.Root, OutputCerts)
	opts.ResolvConf = v.ResolvConf
	a := istioagent.Start(t, opts)
	v.mu.Lock()
	v.sidecar, v.registration = a, opts.Env["POD_NAME"]
	v.restarts++
	v.mu.Unlock()
	return v.connectEnvoy(context.Background())
}

// connectEnvoy opens the stream Envoy would open on pilot-agent's XDS
// socket and plays Envoy's part on it (PlayEnvoy) until the stream ends.
func (v *VM) connectEnvoy(ctx context.Context) error {
	ectx, cancel := context.WithCancel(ctx)
	c, err := istioagent.Connect(ectx, v.Sidecar())
	if err != nil {
		cancel()
		return err
	}
	v.mu.Lock()
	v.envoy, v.stopEnvoy = c, cancel
	if v.eds == nil {
		v.eds = newEDSLog()
	}
	eds := v.eds
	v.mu.Unlock()
	go func() { _ = playEnvoy(ectx, c, eds) }()
	return nil
}

// Endpoints returns what the VM's sidecar was sent over EDS for cluster
// (through pilot-agent, from its discovery address): the latest endpoints
// ("ip:port") and every endpoint the cluster ever had, sorted, and whether
// EDS ever held cluster.
func (v *VM) Endpoints(cluster string) (latest, ever []string, ok bool) {
	v.mu.Lock()
	eds := v.eds
	v.mu.Unlock()
	if eds == nil {
		return nil, nil, false
	}
	return eds.endpoints(cluster)
}

// stopSidecar stops pilot-agent, as when the VM's sidecar is stopped or the
// VM goes away.
func (v *VM) stopSidecar() {
	v.mu.Lock()
	stopEnvoy, envoy, sidecar := v.stopEnvoy, v.envoy, v.sidecar
	v.stopEnvoy, v.envoy = nil, nil
	v.mu.Unlock()
	if stopEnvoy != nil {
		stopEnvoy()
		_ = envoy.Close()
	}
	if sidecar != nil {
		sidecar.Stop()
	}
}

// PowerOff kills the VM's onboarding agent (no unregistering) and stops its
// sidecar: the VM is gone without a word.
func (v *VM) PowerOff() error {
	if v.agent == nil {
		return errors.New("no onboarding agent runs")
	}
	_ = v.agent.Process.Kill()
	<-v.agentDone
	v.agent = nil
	v.stopSidecar()
	return nil
}

// Shutdown stops the onboarding agent gracefully (it unregisters and stops
// the sidecar through the unit), then the unit.
func (v *VM) Shutdown() {
	if v.agent != nil {
		testenv.Terminate(v.agent.Process, syscall.SIGTERM, v.agentDone, 20*time.Second)
		v.agent = nil
	}
	if v.stopAgent != nil {
		v.stopAgent()
		select {
		case err := <-v.agentDone:
			if err != nil {
				v.tb.Errorf("%s: onboarding agent: %v", v.Name, err)
			}
		case <-time.After(30 * time.Second):
			v.tb.Errorf("%s: onboarding agent did not stop", v.Name)
		}
		v.stopAgent = nil
	}
	if v.unit != nil {
		v.unit.Close()
		v.unit = nil
	}
	v.stopSidecar()
}

// Close stops the VM's application (its IMDS belongs to the simulated
// region).
func (v *VM) Close() {
	if v.App != nil {
		v.App.Close()
	}
}

// AgentLog returns the lines of the VM's onboarding agent log that contain
// any of words.
func (v *VM) AgentLog(words ...string) string {
	b, err := os.ReadFile(filepath.Join(v.Root, AgentLogFile))
	if err != nil {
		return ""
	}
	return GrepLines(string(b), words...)
}

// GrepLines returns the lines of s that contain any of words.
func GrepLines(s string, words ...string) string {
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
