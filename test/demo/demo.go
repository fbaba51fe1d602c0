package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/demo/dig"
	"github.com/embark-mesh/embark/test/demo/istiodview"
	"github.com/embark-mesh/embark/test/demo/step"
	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/meshnet"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/test/vmsim"
)

const (
	endpointHost = "onboarding-endpoint.demo.embark"
	// replica names the endpoint process: the ISTIOD column of istioctl
	// proxy-status and the replica holding each connection.
	replica = "embark-demo-0"
	// gracePeriod is shortened from the default 5m so that the demo shows
	// the removal of a workload that stays disconnected.
	gracePeriod = 15 * time.Second
	// outOfTrafficAfter is registration.outOfTrafficAfter, its default:
	// a VM whose sidecar stays away this long leaves the pods' endpoints,
	// its registration kept for the grace period.
	outOfTrafficAfter = 10 * time.Second
	// waitFor bounds every wait for the system to reach a state.
	waitFor = 30 * time.Second
	// pollInterval is how often a wait checks (checks run kubectl and
	// istioctl: not more often).
	pollInterval = 200 * time.Millisecond
)

// vmLabels are the workload labels every VM's onboarding agent declares.
var vmLabels = map[string]string{"version": "v5"}

// demo is the state shared by the steps.
type demo struct {
	out         io.Writer
	interactive bool
	work        string
	tb          *step.TB

	env          *testenv.Env
	aws          *simulatedAWS
	platforms    *simulatedPlatforms // ECS, GCE and Azure (platforms.go)
	vms          []*vm.VM
	denied       *vm.VM
	refused      []*vm.VM // the other platforms' refused workloads
	endpointDone chan error
	stopEndpoint context.CancelFunc
	serving      servingCert
	addrs        struct{ onboarding, xds, debugXDS, metrics string }
	appPort      int // the port of every VM's application, on its own IP
	api          onboardingv1alpha1.OnboardingServiceClient
	conn         *grpc.ClientConn

	istiod     *testenv.Istiod      // see istiod.go
	istiodRoot string               // its CA root, as a file
	pod        *istiodview.PodProxy // productpage's proxy on istiod

	poweredOff time.Time     // when the powered-off VM's sidecar stopped
	upstream   *dig.Upstream // the usual resolver of the VM on the VM network (dns.go)
	removed    *vm.VM        // the VM whose registration the grace period removed
}

// run runs the demo and cleans up everything it started before returning.
func run(ctx context.Context, out io.Writer, interactive bool) error {
	work, err := os.MkdirTemp("", "embark-demo-")
	if err != nil {
		return err
	}
	d := &demo{out: out, interactive: interactive, work: work, aws: &simulatedAWS{}}
	logFile, err := os.Create(filepath.Join(work, "demo.log"))
	if err != nil {
		_ = os.RemoveAll(work)
		return err
	}
	d.tb = step.NewTB(ctx, logFile, work)
	defer func() {
		d.cleanup()
		_ = logFile.Close()
		_ = os.RemoveAll(work)
	}()

	fmt.Fprintln(out, "Embark demo: EC2 instances, an on-prem host, an ECS task, a Compute Engine and an Azure VM onboard into a local control plane and connect their Istio sidecars")
	if err := step.Run(ctx, out, d.steps()); err != nil {
		d.showLogsOnFailure()
		return err
	}
	if !interactive {
		fmt.Fprintln(out, "\ndemo: every step showed what it should (non-interactive: not waiting for Ctrl-C)")
		return nil
	}
	d.printRunning()
	select {
	case <-ctx.Done():
	case err := <-d.endpointDone:
		return fmt.Errorf("endpoint stopped: %w", err)
	}
	fmt.Fprintln(out, "\ncleaning up")
	return nil
}

// steps lists the demo's steps; their number is fixed before the first runs.
func (d *demo) steps() []step.Step {
	d.vms = []*vm.VM{{Name: "ratings-1"}, {Name: "ratings-2"}, {Name: "ratings-3"}}
	d.denied = &vm.VM{Name: "intruder-1"}
	steps := []step.Step{
		{Title: "start a local kube-apiserver + etcd + kube-controller-manager with Embark's and Istio's CRDs", Run: d.startControlPlane},
		{Title: "create namespace bookinfo with the example WorkloadGroup, OnboardingPolicy and Sidecar", Run: d.applySeeds},
		{Title: "declare the pods' network (kube-network: the istio-system label, vmgateway's address), start a real istiod (pilot-discovery, the mesh's control plane and CA), the ratings Service, and a productpage pod's proxy watching ratings' endpoints", Run: d.startIstiod},
		{Title: "simulate AWS us-east-2: a demo region certificate, STS, and EC2 instances with IMDS", Run: d.simulateAWS},
		{Title: fmt.Sprintf("start the onboarding endpoint in istiod mode (certificates and configuration relayed from istiod; grace period shortened to %v), trusting simulated ECS, Compute Engine and Azure too", gracePeriod), Run: d.startEndpoint},
	}
	for _, v := range d.vms {
		steps = append(steps, step.Step{Title: fmt.Sprintf("start simulated VM %s: its onboarding agent onboards and starts pilot-agent as the sidecar", v.Name),
			Run: func(ctx context.Context, out io.Writer) error { return d.startVM(ctx, out, v) }})
	}
	last := d.vms[len(d.vms)-1]
	steps = append(steps,
		step.Step{Title: "kubectl get war -A: every VM registered, its sidecar connected", Run: d.listRegistrations},
		step.Step{Title: "kubectl get workloadentries: one per VM, connected to this replica", Run: d.listWorkloadEntries},
		step.Step{Title: "kubectl describe war " + d.vms[0].Name + "'s registration", Run: d.describeRegistration},
		step.Step{Title: "istioctl proxy-status against Embark's xDS server: the sidecars connected to Embark", Run: d.proxyStatus},
		step.Step{Title: "istioctl proxy-status against istiod: every VM with CDS, LDS, EDS and RDS SYNCED", Run: d.istiodProxyStatus},
		step.Step{Title: "each VM's workload certificate: from istiod's CA through Embark, identity of the WorkloadGroup's service account", Run: d.certificateIdentity},
		step.Step{Title: "istiod serves every VM to a pod as an endpoint of the ratings Service", Run: d.ratingsEndpoints},
		step.Step{Title: "health flip: " + d.vms[0].Name + "'s application fails its readiness probe, then recovers: WorkloadEntry Healthy follows",
			Run: func(ctx context.Context, out io.Writer) error { return d.healthFlip(ctx, out, d.vms[0]) }},
		step.Step{Title: "an instance of an account no OnboardingPolicy allows is refused", Run: d.refuse},
		step.Step{Title: "kubectl delete war " + d.vms[1].Name + "'s registration: its onboarding agent onboards again and restarts the sidecar",
			Run: func(ctx context.Context, out io.Writer) error { return d.deleteRegistration(ctx, out, d.vms[1]) }},
		step.Step{Title: "WorkloadGroupRollout (maxUnavailable 1): the group changes, each VM onboards again in turn, all connected with the new spec",
			Run: d.rollingUpdate},
		step.Step{Title: "power off " + last.Name + " (onboarding agent killed, sidecar stopped): its registration shows the disconnect",
			Run: func(ctx context.Context, out io.Writer) error { return d.disconnect(ctx, out, last) }},
		step.Step{Title: fmt.Sprintf("%s leaves the pod's endpoints within outOfTrafficAfter (%v): WorkloadEntry Healthy False (AgentDisconnected), registration kept", last.Name, outOfTrafficAfter),
			Run: func(ctx context.Context, out io.Writer) error { return d.outOfTraffic(ctx, out, last) }},
		step.Step{Title: fmt.Sprintf("%s stays away for the grace period (%v): registration and WorkloadEntry removed", last.Name, gracePeriod),
			Run: func(ctx context.Context, out io.Writer) error { return d.gracePeriodRemoval(ctx, out, last) }},
		step.Step{Title: "an on-prem host (" + onPremHost + ") onboards with an OIDC JWT of the kube-apiserver's service-account issuer, next to the EC2 instances",
			Run: d.onPremOnboarding},
	)
	netVM := &vm.VM{Name: "ratings-4"}
	steps = append(steps,
		step.Step{Title: fmt.Sprintf("a VM on network %s (%s): its sidecar, in istiod mode through Embark, gets the pod Service productpage as vmgateway (%s:%d), never the pod's address; the pod gets the VM's own address (no gateway declared for %s)",
			meshnet.VMNetwork, netVM.Name, gatewayAddr, meshnet.GatewayPort, meshnet.VMNetwork),
			Run: func(ctx context.Context, out io.Writer) error { return d.vmOnVMNetwork(ctx, out, netVM) }},
		step.Step{Title: fmt.Sprintf("meshNetworks (ConfigMap istio) declares the gateway of %s (%s:%d): the pod gets ratings through it, never a VM's own address",
			meshnet.VMNetwork, vmGatewayAddr, meshnet.GatewayPort),
			Run: func(ctx context.Context, out io.Writer) error { return d.declareVMGateway(ctx, out, netVM) }},
		step.Step{Title: fmt.Sprintf("%s resolves mesh names through its sidecar's DNS proxy (cluster.env's DNS_PROXY_ADDR): productpage.bookinfo.svc.cluster.local and a ServiceEntry host from istiod's name table, relayed by Embark; a name outside the mesh from its usual resolver; then through its own systemd-resolved, which the agent gives the sidecar's link (mesh domains only)",
			netVM.Name),
			Run: func(ctx context.Context, out io.Writer) error { return d.resolveMeshNames(ctx, out, netVM) }},
		step.Step{Title: "an ECS task (cluster prod, task role ratings-task) onboards through its onboarding agent, a container of the task, next to the EC2 instances and the on-prem host: its task role's STS proof, confirmed with ECS DescribeTasks; a task of cluster staging is refused by the ecs rule",
			Run: func(ctx context.Context, out io.Writer) error { return d.platformOnboarding(ctx, out, d.ecsWorkload()) }},
		step.Step{Title: "a Compute Engine instance (project embark-test) onboards through its onboarding agent with its instance identity token; an instance of project embark-other is refused by the gcp rule",
			Run: func(ctx context.Context, out io.Writer) error { return d.platformOnboarding(ctx, out, d.gceWorkload()) }},
		step.Step{Title: "an Azure VM onboards through its onboarding agent with its managed identity token; a VM of another subscription is refused by the azure rule",
			Run: func(ctx context.Context, out io.Writer) error {
				return d.platformOnboarding(ctx, out, d.azureWorkload())
			}},
	)
	return steps
}

func (d *demo) startControlPlane(ctx context.Context, out io.Writer) error {
	env, err := testenv.Start(testenv.Options{GarbageCollector: true})
	if err != nil {
		return err
	}
	d.env = env
	fmt.Fprintf(out, "kubeconfig %s\n", env.KubeconfigPath)
	return nil
}

func (d *demo) applySeeds(ctx context.Context, out io.Writer) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	if d.appPort, err = freePort(); err != nil {
		return err
	}
	for _, ns := range []string{"bookinfo", "istio-system"} {
		if err := d.env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}
	// The WorkloadGroup's service account: Embark never creates one.
	if err := d.env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: fixtures.ServiceAccount, Namespace: "bookinfo"}}); err != nil {
		return err
	}
	seeds := filepath.Join(root, "api/crds/testdata/seed004")
	args := []string{"apply", "-f", filepath.Join(seeds, "workloadgroup.yaml"), "-f", filepath.Join(seeds, "policy-narrow-ec2-subset.yaml"), "-f", filepath.Join(seeds, "sidecar.yaml")}
	if err := d.kubectl(ctx, out, args...); err != nil {
		return err
	}
	// The seed's WorkloadGroup has no probe; the demo adds one that each
	// VM's sidecar runs against its application.
	probe := fmt.Sprintf(`{"spec":{"probe":{"periodSeconds":1,"failureThreshold":1,"successThreshold":1,"httpGet":{"path":"/ready","port":%d}}}}`, d.appPort)
	if err := d.kubectl(ctx, out, "patch", "workloadgroup", "ratings", "-n", "bookinfo", "--type=merge", "-p", probe); err != nil {
		return err
	}
	return checkCreated(ctx, d.env, "bookinfo")
}

func (d *demo) simulateAWS(ctx context.Context, out io.Writer) error {
	var err error
	if d.aws.ca, err = awstest.NewCA("us-east-2"); err != nil {
		return err
	}
	d.aws.sts = awstest.NewSTS()
	d.aws.ec2iam = awstest.NewEC2IAM()
	// Each VM's private IP is a loopback address of its own, where its
	// application listens: pilot-agent's INSTANCE_IP and the readiness probe
	// reach it on this machine.
	for i, v := range d.vms {
		inst := awstest.Instance{Role: "ratings-role", PrivateIP: fmt.Sprintf("127.0.1.%d", i+1)}
		if i > 0 {
			inst.InstanceID = fmt.Sprintf("i-0de%014d", i)
		}
		if v.IMDS, err = d.aws.instance(inst); err != nil {
			return err
		}
	}
	// An instance of an account no policy allows.
	if d.denied.IMDS, err = d.aws.instance(awstest.Instance{Account: "999999999999", Role: "ratings-role", PrivateIP: "127.0.1.99", InstanceID: "i-0de99999999999999"}); err != nil {
		return err
	}
	fmt.Fprintf(out, "STS %s\nEC2/IAM %s (instance profiles, for the endpoint's instance profile check)\n", d.aws.sts.URL, d.aws.ec2iam.URL)
	for _, v := range append(d.vms, d.denied) {
		in := v.IMDS.Instance()
		fmt.Fprintf(out, "%-10s %s  account %s  zone %s  role %s  private IP %-12s IMDS %s\n", v.Name, in.InstanceID, in.Account, in.Zone, in.Role, in.PrivateIP, v.IMDS.URL)
	}
	return nil
}

func (d *demo) startEndpoint(ctx context.Context, out io.Writer) error {
	var err error
	if d.serving, err = writeServingCert(d.work, endpointHost); err != nil {
		return err
	}
	certs := filepath.Join(d.work, "aws-certs")
	if err := os.MkdirAll(certs, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(certs, "us-east-2.pem"), d.aws.ca.CertificatePEM(), 0o644); err != nil {
		return err
	}
	d.addrs.onboarding, d.addrs.xds, d.addrs.debugXDS, d.addrs.metrics = freeAddr(), freeAddr(), freeAddr(), freeAddr()

	cfg := fmt.Sprintf(`apiVersion: config.onboarding.tetrate.io/v1alpha1
kind: OnboardingEndpointConfiguration
endpoint:
  hosts: [%s]
  certFile: %s
  keyFile: %s
identity:
  aws:
    certificatesDir: %s
    stsEndpoint: %s
    # The seed's policy names iamRoleNames: an STS proof of a role counts
    # only once EC2 and IAM confirm it is the instance profile's role.
    instanceProfileCheck:
      ec2Endpoint: %s
      iamEndpoint: %s
mesh:
  discoveryAddress: %s
  # Sent to every VM in its bootstrap, written there as the sidecar's root certificate.
  rootCertFile: %s
registration:
  # The demo's VMs listen on 127.0.1.x: loopback workload addresses are
  # refused unless allowed (demos and tests only).
  allowLoopbackAddresses: true
  # Health flips are stored at once (no damping), to show them quickly.
  healthDamping: 0s
  gracePeriod: %s
  outOfTrafficAfter: %s
  propagationDelay: 1s
listen:
  onboarding: %s
  metrics: %s
  xds: %s
%s`, endpointHost, d.serving.certFile, d.serving.keyFile, certs, d.aws.sts.URL, d.aws.ec2iam.URL, d.aws.ec2iam.URL, d.addrs.xds, d.serving.caFile, gracePeriod, outOfTrafficAfter, d.addrs.onboarding, d.addrs.metrics, d.addrs.xds, d.istiodConfig())
	if cfg, err = d.withOnPremIssuer(ctx, cfg); err != nil {
		return err
	}
	if err := d.simulatePlatforms(); err != nil {
		return err
	}
	if cfg, err = d.withPlatforms(cfg); err != nil {
		return err
	}
	// The endpoint's own AWS credentials, for its instance profile check,
	// come from the SDK's default chain: here the environment, with the
	// key pair the EC2/IAM fake accepts. (The VMs' agents sign with their
	// IMDS role credentials only.)
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": d.aws.ec2iam.AccessKeyID, "AWS_SECRET_ACCESS_KEY": d.aws.ec2iam.SecretAccessKey,
		"AWS_SESSION_TOKEN": "", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull} {
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	cfgFile := filepath.Join(d.work, "endpoint.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(d.work, "endpoint.log"))
	if err != nil {
		return err
	}
	// Not the step's context: the endpoint outlives the step.
	ectx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ready := make(chan struct{})
	d.endpointDone, d.stopEndpoint = make(chan error, 1), cancel
	go func() {
		err := app.Run(ectx, app.Options{ConfigFile: cfgFile, Kubeconfig: d.env.KubeconfigPath, Replica: replica,
			Logger: slog.New(slog.NewTextHandler(logFile, nil)), Ready: ready, DebugXDS: d.addrs.debugXDS})
		_ = logFile.Close()
		d.endpointDone <- err
	}()
	select {
	case <-ready:
	case err := <-d.endpointDone:
		d.endpointDone <- err // for cleanup
		return fmt.Errorf("endpoint stopped: %w", err)
	case <-time.After(2 * time.Minute):
		return errors.New("endpoint not ready within 2 minutes")
	case <-ctx.Done():
		return ctx.Err()
	}
	fmt.Fprintf(out, "onboarding API  https://%s (TLS as %s)\n", d.addrs.onboarding, endpointHost)
	fmt.Fprintf(out, "xDS             %s (TLS; sidecars authenticate with their bound token)\n", d.addrs.xds)
	fmt.Fprintf(out, "xDS debug       %s (loopback, for istioctl proxy-status)\n", d.addrs.debugXDS)
	fmt.Fprintf(out, "metrics         http://%s/metrics\n", d.addrs.metrics)
	p := d.platforms
	fmt.Fprintf(out, "identity.ecs    task check against ECS %s (DescribeTasks); STS proofs to %s\n", p.ecs.URL, d.aws.sts.URL)
	fmt.Fprintf(out, "identity.gce    Google's keys %s\n", p.google.JWKSURL())
	fmt.Fprintf(out, "identity.azure  tenant %s, audience %s, Entra ID's keys %s\n", p.azureVM.TenantID, azureResource, p.microsoft.JWKSURL())
	d.conn, err = grpc.NewClient(d.addrs.onboarding, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: d.serving.pool, ServerName: endpointHost})))
	if err != nil {
		return err
	}
	d.api = onboardingv1alpha1.NewOnboardingServiceClient(d.conn)
	return nil
}

func (d *demo) startVM(ctx context.Context, out io.Writer, v *vm.VM) error {
	if err := v.StartApp(v.IMDS.Instance().PrivateIP, d.appPort); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	v.Root = filepath.Join(d.work, "vms", v.Name)
	if err := v.StartAgent(d.tb, vm.Settings{Exe: exe, Endpoint: d.addrs.onboarding, ServerName: endpointHost,
		CAFile: d.serving.caFile, Host: v.AWSHost(d.aws.sts.URL), Labels: vmLabels}); err != nil {
		return err
	}
	fmt.Fprintf(out, "onboarding-agent started (root %s)\n", v.Root)
	// The agent onboards, writes the sidecar's bootstrap and restarts the
	// sidecar through its unit; the sidecar connects.
	if err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		if name, restarts := v.State(); restarts == 0 {
			return fmt.Errorf("the onboarding agent has not started the sidecar yet; its log:\n%s", v.AgentLog("level="))
		} else if name == "" {
			return errors.New("the sidecar's cluster.env names no registration")
		}
		return d.checkConnected(ctx, v, metav1.ConditionTrue)
	}); err != nil {
		return err
	}
	name, _ := v.State()
	fmt.Fprintf(out, "%s\n", v.AgentLog("onboarded", "sidecar (re)started"))
	fmt.Fprintf(out, "sidecar files written by the agent: %s, %s, %s\n", vmsim.ClusterEnv, vmsim.MeshConfig, vmsim.Token)
	fmt.Fprintf(out, "pilot-agent (DISABLE_ENVOY=true) started by the agent's restart command; registration bookinfo/%s: AgentConnected=True\n", name)
	return nil
}

// checkConnected checks v's registration's AgentConnected condition.
func (d *demo) checkConnected(ctx context.Context, v *vm.VM, want metav1.ConditionStatus) error {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := d.env.Client.Get(ctx, keyOf(v), war); err != nil {
		return err
	}
	if v.UID != "" && war.UID == v.UID {
		return fmt.Errorf("%s is still the registration %s", war.Name, v.UID)
	}
	for _, c := range war.Status.Conditions {
		if c.Type == runtimev1alpha1.ConditionAgentConnected {
			if c.Status != want {
				return fmt.Errorf("%s: AgentConnected=%s (%s), want %s", v.Reg(), c.Status, c.Reason, want)
			}
			return nil
		}
	}
	return fmt.Errorf("%s: no AgentConnected condition yet", v.Reg())
}

func (d *demo) listRegistrations(ctx context.Context, out io.Writer) error {
	want := map[string]string{}
	for _, v := range d.vms {
		want["bookinfo/"+v.Reg()] = "True"
	}
	return d.showChecked(ctx, out, func(s string) error { return check.WARs(s, want) }, "get", "war", "-A")
}

func (d *demo) listWorkloadEntries(ctx context.Context, out io.Writer) error {
	cols := "NAME:.metadata.name,ADDRESS:.spec.address,NETWORK:.spec.network,LOCALITY:.spec.locality,REPLICA:.metadata.annotations.onboarding\\.tetrate\\.io/connected-replica,CONNECTED AT:.metadata.annotations.onboarding\\.tetrate\\.io/connected-at"
	want := map[string]string{}
	for _, v := range d.vms {
		want[v.Reg()] = replica
	}
	return d.showChecked(ctx, out, func(s string) error { return check.Column(s, "WorkloadEntry", "NAME", "REPLICA", want) },
		"get", "workloadentries", "-n", "bookinfo", "-o", "custom-columns="+cols)
}

func (d *demo) describeRegistration(ctx context.Context, out io.Writer) error {
	v := d.vms[0]
	in := v.IMDS.Instance()
	return d.showChecked(ctx, out, func(s string) error {
		return check.Contains(s, v.Reg(), "Instance Id:", in.InstanceID, in.PrivateIP,
			runtimev1alpha1.ConditionAgentConnected, runtimev1alpha1.ReasonAgentEstablishedConnection, replica)
	}, "describe", "war", "-n", "bookinfo", v.Reg())
}

func (d *demo) proxyStatus(ctx context.Context, out io.Writer) error {
	want := map[string]string{}
	for _, v := range d.vms {
		want[v.Reg()+".bookinfo"] = replica
	}
	args := []string{"proxy-status", "--xds-address", d.addrs.debugXDS, "--plaintext", "-r", "default"}
	if err := d.istioctlChecked(ctx, out, func(s string) error { return check.ProxyStatus(s, want) }, args...); err != nil {
		return err
	}
	// Per type: the configuration Embark relays reached each sidecar
	// (through pilot-agent, to the Envoy part the demo plays) and was ACKed.
	return d.istioctlChecked(ctx, out, func(s string) error {
		return check.Synced(s, len(want), "CDS", "LDS", "EDS", "RDS")
	}, append(args, "-v", "1")...)
}

func (d *demo) healthFlip(ctx context.Context, out io.Writer, v *vm.VM) error {
	cols := `NAME:.metadata.name,HEALTHY:.status.conditions[?(@.type=="Healthy")].status,REASON:.status.conditions[?(@.type=="Healthy")].reason,MESSAGE:.status.conditions[?(@.type=="Healthy")].message`
	healthy := func(unhealthy *vm.VM) map[string]string {
		want := map[string]string{}
		for _, o := range d.vms {
			want[o.Reg()] = "True"
		}
		if unhealthy != nil {
			want[unhealthy.Reg()] = "False"
		}
		return want
	}
	show := func(want map[string]string, unhealthy *vm.VM) error {
		if err := d.showRatingsEndpoints(ctx, out, d.wantEndpoints(unhealthy, nil)); err != nil {
			return err
		}
		if err := d.showChecked(ctx, out, func(s string) error { return check.Column(s, "WorkloadEntry", "NAME", "HEALTHY", want) },
			"get", "workloadentries", "-n", "bookinfo", "-o", "custom-columns="+cols); err != nil {
			return err
		}
		return d.showChecked(ctx, out, func(s string) error { return check.Column(s, "registration", "NAME", "HEALTHY", want) },
			"get", "war", "-n", "bookinfo", "-o", "wide")
	}
	fmt.Fprintf(out, "every sidecar probes its application (GET /ready on port %d of its IP, every 1s):\n", d.appPort)
	if err := show(healthy(nil), nil); err != nil {
		return err
	}
	v.App.SetHealthy(false)
	fmt.Fprintf(out, "\n%s's application now answers /ready with 503:\n", v.Name)
	if err := show(healthy(v), v); err != nil {
		return err
	}
	v.App.SetHealthy(true)
	fmt.Fprintf(out, "\n%s's application recovers:\n", v.Name)
	return show(healthy(nil), nil)
}

func (d *demo) refuse(ctx context.Context, out io.Writer) error {
	v := d.denied
	in := v.IMDS.Instance()
	fmt.Fprintf(out, "%s (%s, account %s) onboards:\n", v.Name, in.InstanceID, in.Account)
	_, err := v.Onboard(ctx, d.api, d.aws.sts.URL, endpointHost)
	if err == nil {
		return errors.New("the instance was onboarded, but no policy allows its account")
	}
	st := status.Convert(err)
	fmt.Fprintf(out, "%s: %s\n", st.Code(), st.Message())
	// The instance learns nothing of the policy; the operator reads the
	// reason in the endpoint's log line of that request ID and in the
	// WorkloadGroup's Event.
	if err := check.Contains(st.Code().String()+": "+st.Message(), "PermissionDenied", "not authorized to onboard (request id "); err != nil {
		return err
	}
	if strings.Contains(st.Message(), "999999999999") || strings.Contains(st.Message(), "123456789012") {
		return fmt.Errorf("the refused instance was told the policy: %q", st.Message())
	}
	id := strings.TrimSuffix(st.Message()[strings.LastIndex(st.Message(), " ")+1:], ")")
	line, err := d.endpointLogLine("requestID=" + id)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "the endpoint's log line of request id %s:\n%s", id, step.Indent(line))
	if err := check.Contains(line, "account 999999999999 not in [123456789012]"); err != nil {
		return err
	}
	return d.showChecked(ctx, out, func(s string) error {
		return check.Contains(s, "OnboardingDenied", "ratings", "account 999999999999 not in [123456789012]")
	}, "get", "events", "-n", "bookinfo", "--field-selector", "reason=OnboardingDenied", "-o", "custom-columns=TYPE:.type,REASON:.reason,OBJECT:.involvedObject.name,COUNT:.count,MESSAGE:.message")
}

// endpointLogLine returns the first line of the endpoint's log holding s.
func (d *demo) endpointLogLine(s string) (string, error) {
	b, err := os.ReadFile(filepath.Join(d.work, "endpoint.log"))
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, s) {
			return line, nil
		}
	}
	return "", fmt.Errorf("no line of the endpoint's log holds %q", s)
}

func (d *demo) disconnect(ctx context.Context, out io.Writer, v *vm.VM) error {
	if err := v.PowerOff(); err != nil {
		return err
	}
	d.poweredOff = time.Now()
	fmt.Fprintf(out, "%s: onboarding-agent killed (it does not unregister), pilot-agent stopped\n", v.Name)
	want := map[string]string{}
	for _, o := range d.vms {
		want["bookinfo/"+o.Reg()] = "True"
	}
	want["bookinfo/"+v.Reg()] = "False"
	if err := d.showChecked(ctx, out, func(s string) error { return check.WARs(s, want) }, "get", "war", "-A"); err != nil {
		return err
	}
	// A sidecar that comes back within outOfTrafficAfter (a restart, a
	// network blip, a replica rolled) never leaves traffic: istiod still
	// serves the VM; the next step shows it leave.
	fmt.Fprintf(out, "%s stays in traffic for outOfTrafficAfter (%v), in case its sidecar comes back:\n", v.Name, outOfTrafficAfter)
	return d.showRatingsEndpoints(ctx, out, d.wantEndpoints(nil, nil))
}

// outOfTraffic shows the powered-off VM leave the pod's endpoints once its
// sidecar has stayed away for outOfTrafficAfter, well before the grace
// period removes its registration, and checks when it left.
func (d *demo) outOfTraffic(ctx context.Context, out io.Writer, v *vm.VM) error {
	fmt.Fprintf(out, "waiting for %s to leave the pod's endpoints ...\n", v.Name)
	if err := d.showRatingsEndpoints(ctx, out, d.wantEndpoints(v, nil)); err != nil {
		return err
	}
	took := time.Since(d.poweredOff)
	fmt.Fprintf(out, "%s left the pod's endpoints %.1fs after its sidecar stopped (outOfTrafficAfter %v, grace period %v)\n", v.Name, took.Seconds(), outOfTrafficAfter, gracePeriod)
	if took >= gracePeriod {
		return fmt.Errorf("%s left the endpoints only %v after its sidecar stopped, not before the grace period (%v)", v.Name, took, gracePeriod)
	}
	cols := `NAME:.metadata.name,HEALTHY:.status.conditions[?(@.type=="Healthy")].status,REASON:.status.conditions[?(@.type=="Healthy")].reason`
	healthy, reasons := map[string]string{}, map[string]string{}
	for _, o := range d.vms {
		healthy[o.Reg()], reasons[o.Reg()] = "True", runtimev1alpha1.ReasonProbeSucceeded
	}
	healthy[v.Reg()], reasons[v.Reg()] = "False", runtimev1alpha1.ReasonAgentDisconnected
	if err := d.showChecked(ctx, out, func(s string) error {
		if err := check.Column(s, "WorkloadEntry", "NAME", "HEALTHY", healthy); err != nil {
			return err
		}
		return check.Column(s, "WorkloadEntry", "NAME", "REASON", reasons)
	}, "get", "workloadentries", "-n", "bookinfo", "-o", "custom-columns="+cols); err != nil {
		return err
	}
	want := map[string]string{}
	for _, o := range d.vms {
		want["bookinfo/"+o.Reg()] = "True"
	}
	want["bookinfo/"+v.Reg()] = "False"
	fmt.Fprintf(out, "its registration stays for the grace period: the VM comes back without onboarding again if its sidecar reconnects\n")
	return d.showChecked(ctx, out, func(s string) error { return check.WARs(s, want) }, "get", "war", "-A")
}

func (d *demo) deleteRegistration(ctx context.Context, out io.Writer, v *vm.VM) error {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := d.env.Client.Get(ctx, keyOf(v), war); err != nil {
		return err
	}
	_, restarts := v.State()
	if err := d.kubectl(ctx, out, "delete", "war", "-n", "bookinfo", v.Reg()); err != nil {
		return err
	}
	v.UID = war.UID
	defer func() { v.UID = "" }()
	if err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		if _, n := v.State(); n == restarts {
			return fmt.Errorf("the onboarding agent has not restarted the sidecar; its log:\n%s", v.AgentLog("level="))
		}
		return d.checkConnected(ctx, v, metav1.ConditionTrue) // a registration with another UID
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s's onboarding agent:\n%s\n", v.Name, v.AgentLog("deleted", "onboarded", "sidecar (re)started"))
	want := map[string]string{}
	for _, o := range d.vms {
		want["bookinfo/"+o.Reg()] = "True"
	}
	return d.showChecked(ctx, out, func(s string) error { return check.WARs(s, want) }, "get", "war", "-A")
}

func (d *demo) gracePeriodRemoval(ctx context.Context, out io.Writer, v *vm.VM) error {
	fmt.Fprintf(out, "waiting for the grace period of %v to pass ...\n", gracePeriod)
	gone := func() error {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := d.env.Client.Get(ctx, keyOf(v), war); !apierrors.IsNotFound(err) {
			return fmt.Errorf("registration %s still exists (%v)", v.Reg(), err)
		}
		we := &istionetworkingv1.WorkloadEntry{}
		if err := d.env.Client.Get(ctx, keyOf(v), we); !apierrors.IsNotFound(err) {
			return fmt.Errorf("WorkloadEntry %s still exists (%v)", v.Reg(), err)
		}
		return nil
	}
	if err := fixtures.Poll(ctx, pollInterval, gracePeriod+waitFor, gone); err != nil {
		return err
	}
	d.removed = v
	want := map[string]string{}
	for _, o := range d.vms {
		if o != v {
			want["bookinfo/"+o.Reg()] = "True"
		}
	}
	if err := d.showChecked(ctx, out, func(s string) error { return check.WARs(s, want) }, "get", "war", "-A"); err != nil {
		return err
	}
	if err := d.showChecked(ctx, out, func(s string) error {
		if strings.Contains(s, v.Reg()) {
			return fmt.Errorf("WorkloadEntry %s is still listed", v.Reg())
		}
		return nil
	}, "get", "workloadentries", "-n", "bookinfo"); err != nil {
		return err
	}
	return d.showRatingsEndpoints(ctx, out, d.wantEndpoints(nil, v))
}

// kubectl runs kubectl with the demo's kubeconfig and shows the command and
// its output.
func (d *demo) kubectl(ctx context.Context, out io.Writer, args ...string) error {
	s, err := d.env.Kubectl(ctx, nil, args...)
	fmt.Fprintf(out, "$ kubectl %s\n%s", strings.Join(args, " "), s)
	return err
}

// showChecked runs kubectl until check accepts its output (the system
// converges asynchronously), then shows the command and the output; on
// timeout it shows the last output and check's complaint.
func (d *demo) showChecked(ctx context.Context, out io.Writer, check func(string) error, args ...string) error {
	var shown string
	err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		s, err := d.env.Kubectl(ctx, nil, args...)
		if err != nil {
			return err
		}
		shown = s
		return check(s)
	})
	fmt.Fprintf(out, "$ kubectl %s\n%s", strings.Join(args, " "), shown)
	return err
}

// printRunning tells how to look at the running system.
func (d *demo) printRunning() {
	kc := "kubectl --kubeconfig " + d.env.KubeconfigPath
	fmt.Fprintf(d.out, `
Embark is running. Try:
    %s get war -A
    %s describe war -n bookinfo %s
    %s get workloadentries -n bookinfo -o yaml
    %s --kubeconfig %s proxy-status --xds-address %s --plaintext -r default
    %s --kubeconfig %s proxy-status --xds-address %s --plaintext -r default -v 1   # istiod
    curl -s http://%s/debug/config_dump?proxyID=%s.bookinfo   # istiod's configuration of a VM
    curl -s http://%s/debug/networkz   # istiod's network gateways
    curl -s http://%s/metrics | grep ^embark_
Onboarding API https://%s (as %s), xDS %s, istiod %s; logs and files in %s (istiod's in %s).
Press Ctrl-C to stop and clean up.
`, kc, kc, d.vms[0].Reg(), kc, filepath.Join(mustAssets(), "istioctl"), d.env.KubeconfigPath, d.addrs.debugXDS,
		filepath.Join(mustAssets(), "istioctl"), d.env.KubeconfigPath, d.istiod.GRPCAddr, d.istiod.HTTPAddr, d.vms[0].Reg(), d.istiod.HTTPAddr, d.addrs.metrics,
		d.addrs.onboarding, endpointHost, d.addrs.xds, d.istiod.SecureGRPCAddr, d.work, d.istiod.LogPath)
}

// showLogsOnFailure prints where the logs are cut short: the endpoint's last
// lines tell why most failures happened.
func (d *demo) showLogsOnFailure() {
	b, err := os.ReadFile(filepath.Join(d.work, "endpoint.log"))
	if err == nil && len(b) > 0 {
		fmt.Fprintf(d.out, "\nlast lines of the onboarding endpoint's log:\n%s", step.Indent(tail(string(b), 20)))
	}
}

// cleanup stops everything, sidecars first, then the endpoint, then the
// control plane.
func (d *demo) cleanup() {
	// Each onboarding agent unregisters and stops its sidecar, as on a VM
	// shutting down.
	var wg sync.WaitGroup
	for _, v := range d.vms {
		wg.Add(1)
		go func() { defer wg.Done(); v.Shutdown() }()
	}
	wg.Wait()
	// The refused workloads' agents: they retry until stopped.
	for _, v := range d.refused {
		v.Shutdown()
	}
	d.tb.Close() // pilot-agents left
	for _, v := range append(append(d.vms, d.denied), d.refused...) {
		if v != nil {
			v.Close()
		}
	}
	if d.conn != nil {
		_ = d.conn.Close()
	}
	if d.upstream != nil {
		_ = d.upstream.Close()
	}
	if d.stopEndpoint != nil {
		d.stopEndpoint()
		select {
		case <-d.endpointDone:
		case <-time.After(30 * time.Second):
			fmt.Fprintln(os.Stderr, "demo: the endpoint did not stop within 30s")
		}
	}
	d.stopIstiod()
	d.platforms.close()
	d.aws.close()
	if d.env != nil {
		if err := d.env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		}
	}
}
