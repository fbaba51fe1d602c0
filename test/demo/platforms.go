package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
)

// azureResource is the resource (audience) an Azure VM's agent asks its
// managed identity token for, and the endpoint accepts.
const azureResource = "api://embark-onboarding"

// simulatedPlatforms are the other platforms on loopback: an ECS API (for
// the endpoint's taskCheck) and each ECS task's metadata and credentials
// endpoints, Google's keys and each GCE instance's metadata server,
// Entra ID's keys and each Azure VM's Instance Metadata Service. Each
// platform has a workload its OnboardingPolicy rule allows and one it
// refuses.
type simulatedPlatforms struct {
	ecs                *awstest.ECS
	task, otherTask    *awstest.TaskMetadata
	google             *gcetest.Google
	gce, otherGCE      *gcetest.MetadataServer
	microsoft          *azuretest.Microsoft
	azure, otherAzure  *azuretest.IMDS
	gceInst, otherInst gcetest.Instance
	azureVM, otherVM   azuretest.VM
	closers            []func() // of every fake started, in order
}

// The workloads of the other platforms, each at a loopback address of its
// own where the allowed one's application listens.
const (
	ecsTaskIP, otherTaskIP = "127.0.1.61", "127.0.1.71"
	gceIP, otherGCEIP      = "127.0.1.62", "127.0.1.72"
	azureIP, otherAzureIP  = "127.0.1.63", "127.0.1.73"
)

// simulatePlatforms starts the fakes of ECS, GCE and Azure (the endpoint
// trusts them in withPlatforms). The ECS API accepts the endpoint's own
// credentials, those of the EC2/IAM fake.
func (d *demo) simulatePlatforms() error {
	p := &simulatedPlatforms{}
	d.platforms = p
	p.ecs = awstest.NewECS(awstest.WithECSKey(d.aws.ec2iam.AccessKeyID, d.aws.ec2iam.SecretAccessKey))
	p.closers = append(p.closers, p.ecs.Close)
	task := p.ecs.Put(awstest.Task{Role: "ratings-task", TaskID: "158d1c8083dd49d6b527399fd6414f5c", Address: ecsTaskIP})
	other := p.ecs.Put(awstest.Task{Role: "ratings-task", Cluster: "staging", TaskID: "9e2c4f1a7b3d4e5f8a6b0c1d2e3f4a5b", Address: otherTaskIP})
	p.task = awstest.NewTaskMetadata(task, d.aws.sts, "task-auth-token")
	p.otherTask = awstest.NewTaskMetadata(other, d.aws.sts, "other-task-auth-token")
	p.closers = append(p.closers, p.task.Close, p.otherTask.Close)

	var err error
	if p.google, err = gcetest.NewGoogle(); err != nil {
		return err
	}
	p.closers = append(p.closers, p.google.Close)
	p.gceInst = gcetest.DefaultInstance()
	p.gceInst.InstanceName, p.gceInst.IP = "ratings-gce-1", gceIP
	p.otherInst = gcetest.DefaultInstance()
	p.otherInst.ProjectID, p.otherInst.ProjectNumber, p.otherInst.InstanceID = "embark-other", 210987654321, "7261548390127364581"
	p.otherInst.InstanceName, p.otherInst.IP = "ratings-gce-9", otherGCEIP
	p.otherInst.ServiceAccount = "ratings@embark-other.iam.gserviceaccount.com"
	p.gce, p.otherGCE = gcetest.NewMetadataServer(p.google, p.gceInst), gcetest.NewMetadataServer(p.google, p.otherInst)
	p.closers = append(p.closers, p.gce.Close, p.otherGCE.Close)

	if p.microsoft, err = azuretest.NewMicrosoft(); err != nil {
		return err
	}
	p.closers = append(p.closers, p.microsoft.Close)
	p.azureVM = azuretest.DefaultVM()
	p.azureVM.Name, p.azureVM.IP = "ratings-az-1", azureIP
	p.otherVM = azuretest.DefaultVM()
	p.otherVM.SubscriptionID, p.otherVM.Name, p.otherVM.IP = "5c8e2a91-7d3b-4f60-9e14-a2b6c8d0e4f7", "ratings-az-9", otherAzureIP
	p.otherVM.VMID, p.otherVM.PrincipalID = "4d7e9a12-3b5c-4e6f-8a1b-2c3d4e5f6a7b", "e1f2a3b4-c5d6-4e7f-8091-a2b3c4d5e6f7"
	p.azure, p.otherAzure = azuretest.NewIMDS(p.microsoft, p.azureVM), azuretest.NewIMDS(p.microsoft, p.otherVM)
	p.closers = append(p.closers, p.azure.Close, p.otherAzure.Close)
	return nil
}

// withPlatforms adds identity.ecs (with the task check against the ECS
// fake), identity.gce (Google's keys) and identity.azure (Entra ID's keys,
// the tenant, the resource) to the endpoint's configuration.
func (d *demo) withPlatforms(cfg string) (string, error) {
	p := d.platforms
	googleCA, msCA := filepath.Join(d.work, "google-ca.pem"), filepath.Join(d.work, "microsoft-ca.pem")
	if err := os.WriteFile(googleCA, p.google.CACertificates(), 0o600); err != nil {
		return "", err
	}
	if err := os.WriteFile(msCA, p.microsoft.CACertificates(), 0o600); err != nil {
		return "", err
	}
	const section = "\nidentity:\n"
	if !strings.Contains(cfg, section) {
		return "", errors.New("the endpoint configuration has no identity section")
	}
	return strings.Replace(cfg, section, section+fmt.Sprintf(`  ecs:
    # Every task is confirmed with ECS DescribeTasks (cluster, task
    # definition, task role, ENI address).
    taskCheck:
      ecsEndpoint: %s
  gce:
    jwksURL: %q
    caFile: %s
  azure:
    tenants: [%s]
    audiences: [%q]
    jwksURL: %q
    caFile: %s
`, p.ecs.URL, p.google.JWKSURL(), googleCA, p.azureVM.TenantID, azureResource, p.microsoft.JWKSURL(), msCA), 1), nil
}

// close stops every fake started, the metadata servers before the key
// endpoints.
func (p *simulatedPlatforms) close() {
	if p == nil {
		return
	}
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
	p.closers = nil
}

// platformWorkload is what a step of another platform shows: its rule, the
// workload it allows, onboarding through its own agent, and another it
// refuses.
type platformWorkload struct {
	policyName string
	rule       string   // the rule's workloads and addresses, YAML under allow[0]
	ruleShows  []string // what kubectl get onboardingpolicy must show of it
	allowed    *vm.VM
	host       string   // the allowed workload's agent's host section
	env        []string // its agent's environment
	wantName   string   // its registration's name, as docs/identity.md promises
	platformLn string   // the agent log line naming its platform
	describe   [][2]string
	// proof says what the platform's fakes were asked while the workload
	// onboarded, and fails when they were not asked at all.
	proof      func() (string, error)
	refused    *vm.VM
	refusedIn  string // what the refused workload is, for the reader
	otherHost  string
	otherEnv   []string
	otherValue string // what of the refused workload the rule does not allow
	reason     string // the refusal's reason, in the endpoint's log and Event
	secret     string // part of the rule the refused workload must not be told
}

func (d *demo) ecsWorkload() platformWorkload {
	p := d.platforms
	t, o := p.task.Task(), p.otherTask.Task()
	env := func(m *awstest.TaskMetadata) []string {
		return []string{platform.EnvECSMetadataURIV4 + "=" + m.MetadataURI, platform.EnvContainerCredentialsRel + "=",
			platform.EnvContainerCredentialsFull + "=" + m.CredentialsURI, platform.EnvContainerAuthToken + "=" + m.AuthorizationToken}
	}
	return platformWorkload{
		policyName: "ecs-tasks",
		rule: fmt.Sprintf(`    - ecs:
        accounts: ["%s"]
        regions: [%s]
        zones: [%s]
        clusters: [%s]
        taskRoles: [%s]
`, t.Account, t.Region, t.Zone, t.Cluster, t.Role),
		ruleShows:  []string{"ecs:", "clusters:", "- " + t.Cluster, "taskRoles:", "- " + t.Role},
		allowed:    &vm.VM{Name: "ecs-task-" + t.TaskID[:8], PlatformIP: t.Address},
		host:       vm.ECSHost(d.aws.sts.URL),
		env:        env(p.task),
		wantName:   fmt.Sprintf("ratings-aws-aws-%s-%s-ecs-%s-%s", t.Account, t.Region, t.Cluster, t.TaskID),
		platformLn: "platform: ecs detected",
		describe: [][2]string{{"Account", t.Account}, {"Region", t.Region}, {"Zone", t.Zone}, {"Cluster", t.Cluster},
			{"Task Arn", t.ARN()}, {"Task Id", t.TaskID}, {"Task Role", t.Role},
			{"Family", t.Family}, {"Revision", fmt.Sprint(t.Revision)}, {"Task Confirmed", "true"}},
		proof: func() (string, error) {
			return asked(fmt.Sprintf("the endpoint confirmed the task with ECS: DescribeTasks answered %d time(s)", p.ecs.Calls("DescribeTasks")),
				p.ecs.Calls("DescribeTasks"))
		},
		refused:    &vm.VM{Name: "ecs-task-" + o.TaskID[:8], PlatformIP: o.Address},
		refusedIn:  fmt.Sprintf("a task of cluster %s, task role %s", o.Cluster, o.Role),
		otherHost:  vm.ECSHost(d.aws.sts.URL),
		otherEnv:   env(p.otherTask),
		otherValue: o.Cluster,
		reason:     fmt.Sprintf("cluster %s not in [%s]", o.Cluster, t.Cluster),
		secret:     "[" + t.Cluster + "]",
	}
}

func (d *demo) gceWorkload() platformWorkload {
	p := d.platforms
	in, o := p.gceInst, p.otherInst
	return platformWorkload{
		policyName: "gce-instances",
		rule: fmt.Sprintf(`    - gcp:
        projects: [%s]
        zones: [%s]
        serviceAccounts: [%s]
        instanceNamePatterns: ["ratings-*"]
    # A GCE token proves no address: the rule names the instances' subnet.
    addressCIDRs: [%s/32]
`, in.ProjectID, in.Zone, in.ServiceAccount, in.IP),
		ruleShows:  []string{"gcp:", "- " + in.ProjectID, "- " + in.ServiceAccount, "ratings-*"},
		allowed:    &vm.VM{Name: in.InstanceName, PlatformIP: in.IP},
		host:       vm.GCEHost(p.gce.URL()),
		wantName:   fmt.Sprintf("ratings-gcp-%s-%s-gce-%s", in.ProjectID, in.Zone, in.InstanceID),
		platformLn: "platform: gce",
		describe: [][2]string{{"Project Id", in.ProjectID}, {"Project Number", fmt.Sprint(in.ProjectNumber)}, {"Zone", in.Zone},
			{"Instance Id", in.InstanceID}, {"Instance Name", in.InstanceName}, {"Service Account", in.ServiceAccount}},
		proof: func() (string, error) {
			return asked(fmt.Sprintf("the metadata server issued %d identity token(s); the endpoint fetched Google's keys %d time(s)", p.gce.Issued(), p.google.Fetches()),
				p.gce.Issued(), p.google.Fetches())
		},
		refused:    &vm.VM{Name: o.InstanceName, PlatformIP: o.IP},
		refusedIn:  fmt.Sprintf("an instance of project %s", o.ProjectID),
		otherHost:  vm.GCEHost(p.otherGCE.URL()),
		otherValue: o.ProjectID,
		reason:     fmt.Sprintf("project %s not in [%s]", o.ProjectID, in.ProjectID),
		secret:     in.ProjectID,
	}
}

func (d *demo) azureWorkload() platformWorkload {
	p := d.platforms
	v, o := p.azureVM, p.otherVM
	rg := strings.ToLower(v.ResourceGroup)
	return platformWorkload{
		policyName: "azure-vms",
		rule: fmt.Sprintf(`    - azure:
        tenants: [%s]
        subscriptions: [%s]
        resourceGroups: [%s]
    # A managed identity token proves no address: the rule names the VMs' subnet.
    addressCIDRs: [%s/32]
`, v.TenantID, v.SubscriptionID, v.ResourceGroup, v.IP),
		ruleShows:  []string{"azure:", "- " + v.TenantID, "- " + v.SubscriptionID, "- " + v.ResourceGroup},
		allowed:    &vm.VM{Name: v.Name, PlatformIP: v.IP},
		host:       vm.AzureHost(p.azure.URL(), azureResource),
		wantName:   fmt.Sprintf("ratings-azure-%s-%s-vm-%s", v.SubscriptionID, rg, v.Name),
		platformLn: "platform: azure",
		describe: [][2]string{{"Tenant Id", v.TenantID}, {"Subscription Id", v.SubscriptionID}, {"Resource Group", rg},
			{"Vm Name", v.Name}, {"Principal Id", v.PrincipalID}},
		proof: func() (string, error) {
			return asked(fmt.Sprintf("the Instance Metadata Service issued %d managed identity token(s); the endpoint fetched Entra ID's keys %d time(s)", p.azure.Issued(), p.microsoft.Fetches()),
				p.azure.Issued(), p.microsoft.Fetches())
		},
		refused:    &vm.VM{Name: o.Name, PlatformIP: o.IP},
		refusedIn:  fmt.Sprintf("a VM of subscription %s", o.SubscriptionID),
		otherHost:  vm.AzureHost(p.otherAzure.URL(), azureResource),
		otherValue: o.SubscriptionID,
		reason:     fmt.Sprintf("subscription %s not in [%s]", o.SubscriptionID, v.SubscriptionID),
		secret:     v.SubscriptionID,
	}
}

// platformOnboarding shows one platform: its OnboardingPolicy rule, the
// workload it allows onboarding through its own agent next to the EC2
// instances and the on-prem host (kubectl get war, kubectl describe war
// with the platform's identity), then another workload refused by the
// rule, with the reason. The allowed workload joins d.vms, so the demo's
// clean-up shuts it down.
func (d *demo) platformOnboarding(ctx context.Context, out io.Writer, w platformWorkload) error {
	policy := filepath.Join(d.work, w.policyName+".yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: %s
  namespace: bookinfo
spec:
  allow:
  - workloads:
%s    onboardTo:
    - workloadGroupSelector: {}
`, w.policyName, w.rule)), 0o600); err != nil {
		return err
	}
	if err := d.kubectl(ctx, out, "create", "-f", policy); err != nil {
		return err
	}
	if err := d.showChecked(ctx, out, func(s string) error { return check.Contains(s, w.ruleShows...) },
		"get", "onboardingpolicy", w.policyName, "-n", "bookinfo", "-o", "yaml"); err != nil {
		return err
	}
	fmt.Fprintln(out)

	v := w.allowed
	v.Root = filepath.Join(d.work, "vms", v.Name)
	d.vms = append(d.vms, v)
	if err := d.startPlatformAgent(v, w.host, w.env); err != nil {
		return err
	}
	if err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		if name, restarts := v.State(); restarts == 0 {
			return fmt.Errorf("the onboarding agent has not started the sidecar yet; its log:\n%s", v.AgentLog("level="))
		} else if name != w.wantName {
			return fmt.Errorf("%s registered as %s, docs/identity.md promises %s", v.Name, name, w.wantName)
		}
		return d.checkConnected(ctx, v, "True")
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s's onboarding agent:\n%s\n", v.Name, v.AgentLog(w.platformLn, "onboarded", "sidecar (re)started"))
	if err := check.Contains(v.AgentLog(w.platformLn), w.platformLn); err != nil {
		return err
	}
	proof, err := w.proof()
	if err != nil {
		return err
	}
	fmt.Fprintln(out, proof)
	fmt.Fprintln(out)
	if err := d.showChecked(ctx, out, func(s string) error { return d.nextToOthers(s, w.wantName) }, "get", "war", "-n", "bookinfo"); err != nil {
		return err
	}
	if err := d.showChecked(ctx, out, func(s string) error { return describes(s, w.wantName, v.IP(), w.describe) },
		"describe", "war", "-n", "bookinfo", w.wantName); err != nil {
		return err
	}
	fmt.Fprintln(out)
	return d.refusePlatform(ctx, out, w)
}

// startPlatformAgent starts v's application on its platform's address and
// its onboarding agent (the demo binary run as onboarding-agent, as for the
// EC2 instances) with host as its host section and env added to its
// environment.
func (d *demo) startPlatformAgent(v *vm.VM, host string, env []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := v.StartApp(v.PlatformIP, d.appPort); err != nil {
		return err
	}
	return v.StartAgent(d.tb, vm.Settings{Exe: exe, Endpoint: d.addrs.onboarding, ServerName: endpointHost, CAFile: d.serving.caFile,
		Host: host, Env: env, Labels: vmLabels})
}

// nextToOthers checks, in kubectl get war's table, that name is connected
// next to a connected EC2 instance and the connected on-prem host.
func (d *demo) nextToOthers(s, name string) error {
	t, err := check.ParseTable(s)
	if err != nil {
		return err
	}
	got, err := t.Column("NAME", "AGENT CONNECTED")
	if err != nil {
		return err
	}
	if got[name] != "True" {
		return fmt.Errorf("%s: AGENT CONNECTED %q, want True", name, got[name])
	}
	var ec2, onPrem bool
	for n, c := range got {
		ec2 = ec2 || (strings.Contains(n, "-aws-") && !strings.Contains(n, "-ecs-") && c == "True")
		onPrem = onPrem || (strings.Contains(n, "-jwt-") && c == "True")
	}
	if !ec2 || !onPrem {
		return fmt.Errorf("not next to a connected EC2 instance (%v) and the connected on-prem host (%v)", ec2, onPrem)
	}
	return nil
}

// describes checks kubectl describe war's output: the registration's name,
// its address, each identity field on a line of its own, and its sidecar
// connected.
func describes(s, name, ip string, fields [][2]string) error {
	if err := check.Contains(s, name, ip, "AgentConnected", "AgentEstablishedConnection"); err != nil {
		return err
	}
	for _, f := range fields {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(f[0]) + `:\s+` + regexp.QuoteMeta(f[1]) + `$`).MatchString(s) {
			return fmt.Errorf("no line %q: %q", f[0], f[1])
		}
	}
	return nil
}

// requestID finds the request ID in a refused agent's log line.
var requestID = regexp.MustCompile(`not authorized to onboard \(request id ([^) ]+)\)`)

// refusePlatform starts the refused workload's onboarding agent, shows its
// refusal (PermissionDenied, which tells it nothing of the policy), the
// reason in the endpoint's log line of that request ID and in the
// WorkloadGroup's OnboardingDenied Event, then stops the agent (it would
// retry).
func (d *demo) refusePlatform(ctx context.Context, out io.Writer, w platformWorkload) error {
	v := w.refused
	v.Root = filepath.Join(d.work, "vms", v.Name)
	d.refused = append(d.refused, v)
	fmt.Fprintf(out, "%s (%s) onboards through its onboarding agent:\n", v.Name, w.refusedIn)
	if err := d.startPlatformAgent(v, w.otherHost, w.otherEnv); err != nil {
		return err
	}
	var line string
	if err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		line = firstLine(v.AgentLog("refused"))
		if line == "" {
			return fmt.Errorf("the onboarding agent was not refused; its log:\n%s", v.AgentLog("level="))
		}
		return nil
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s\n", line)
	if err := check.Contains(line, "code=PermissionDenied", "not authorized to onboard (request id "); err != nil {
		return err
	}
	if strings.Contains(line, w.secret) {
		return fmt.Errorf("the refused workload was told the policy: %q", line)
	}
	m := requestID.FindStringSubmatch(line)
	if m == nil {
		return fmt.Errorf("no request id in %q", line)
	}
	logLine, err := d.endpointLogLine("requestID=" + m[1])
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "the endpoint's log line of request id %s:\n%s", m[1], logLine)
	if err := check.Contains(logLine, w.reason); err != nil {
		return err
	}
	if err := d.showChecked(ctx, out, func(s string) error {
		return check.Contains(s, "OnboardingDenied", "ratings", w.reason)
	}, "get", "events", "-n", "bookinfo", "--field-selector", "reason=OnboardingDenied", "-o", "custom-columns=TYPE:.type,REASON:.reason,OBJECT:.involvedObject.name,COUNT:.count,MESSAGE:.message"); err != nil {
		return err
	}
	v.Shutdown()
	fmt.Fprintf(out, "%s's onboarding agent stopped (it retries while refused); no registration of it:\n", v.Name)
	return d.showChecked(ctx, out, func(s string) error {
		if strings.Contains(s, v.Name) || strings.Contains(s, w.otherValue) {
			return fmt.Errorf("%s has a registration", v.Name)
		}
		return nil
	}, "get", "war", "-n", "bookinfo")
}

// asked returns what, or an error naming it when a count is zero.
func asked(what string, counts ...int) (string, error) {
	for _, n := range counts {
		if n == 0 {
			return "", fmt.Errorf("a fake was never asked: %s", what)
		}
	}
	return what, nil
}

// firstLine returns s's first line.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
