package crds_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	"github.com/embark-mesh/embark/api/crds"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

// seedWARName is the documented example registration name (docs/api.md).
const seedWARName = "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0"

func TestSeed004ExamplesApplyUnchanged(t *testing.T) {
	ctx := t.Context()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bookinfo"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace bookinfo: %v", err)
	}
	files, err := filepath.Glob("testdata/seed004/*.yaml")
	if err != nil || len(files) != 4 {
		t.Fatalf("want the 4 examples of testdata/seed004, got %v (%v)", files, err)
	}
	for _, f := range files {
		// kubectl validates strictly by default: an unknown field would fail here.
		out, err := env.Kubectl(ctx, nil, "apply", "-f", f)
		if err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
		if !strings.Contains(out, "created") {
			t.Errorf("apply %s: %q does not say created", f, out)
		}
	}

	// What was stored is what the seed says.
	wide := &authorizationv1alpha1.OnboardingPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "bookinfo", Name: "allow-any-aws-ec2-instance-in-given-accounts"}, wide); err != nil {
		t.Fatal(err)
	}
	rule := wide.Spec.Allow[0]
	if got := rule.Workloads[0].AWS.Accounts; strings.Join(got, ",") != "123456789012,234567890123" {
		t.Errorf("accounts = %v", got)
	}
	if rule.Workloads[0].AWS.EC2 == nil {
		t.Error("ec2: {} was not kept")
	}
	if sel := rule.OnboardTo[0].WorkloadGroupSelector; len(sel.MatchLabels)+len(sel.MatchExpressions) != 0 {
		t.Errorf("workloadGroupSelector {} stored as %+v", sel)
	}

	narrow := &authorizationv1alpha1.OnboardingPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "bookinfo", Name: "allow-narrow-subset-of-aws-ec2-instances"}, narrow); err != nil {
		t.Fatal(err)
	}
	aws := narrow.Spec.Allow[0].Workloads[0].AWS
	if aws.EC2 == nil || strings.Join(aws.EC2.IAMRoleNames, ",") != "ratings-role" ||
		strings.Join(aws.Regions, ",") != "us-east-2" || strings.Join(aws.Zones, ",") != "us-east-2b" ||
		len(aws.Partitions) != 1 || aws.Partitions[0] != "aws" {
		t.Errorf("narrow policy stored as %+v", aws)
	}
	if got := narrow.Spec.Allow[0].OnboardTo[0].WorkloadGroupSelector.MatchLabels["app"]; got != "ratings" {
		t.Errorf("matchLabels app = %q", got)
	}

	wg := &istionetworkingv1.WorkloadGroup{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "bookinfo", Name: "ratings"}, wg); err != nil {
		t.Fatal(err)
	}
	if wg.Spec.GetTemplate().GetServiceAccount() != "ratings-vm" || wg.Spec.GetTemplate().GetNetwork() != "virtual-machines" {
		t.Errorf("WorkloadGroup template stored as %v", wg.Spec.GetTemplate())
	}
	sc := &istionetworkingv1.Sidecar{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "bookinfo", Name: "bookinfo-ratings-no-iptables"}, sc); err != nil {
		t.Fatal(err)
	}
	if sc.Spec.GetEgress()[0].GetBind() != "127.0.0.2" || sc.Spec.GetIngress()[0].GetDefaultEndpoint() != "127.0.0.1:8080" {
		t.Errorf("Sidecar stored as %v", &sc.Spec)
	}
}

// seedWAR is the example registration `kubectl describe war` shows in
// docs/api.md.
func seedWAR(t *testing.T, ns string) *runtimev1alpha1.WorkloadAutoRegistration {
	t.Helper()
	spec, err := json.Marshal(map[string]any{
		"template": map[string]any{"labels": map[string]string{"app": "ratings", "class": "vm"}, "serviceAccount": "ratings-vm", "network": "virtual-machines"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &runtimev1alpha1.WorkloadAutoRegistration{
		ObjectMeta: metav1.ObjectMeta{Name: seedWARName, Namespace: ns},
		Spec: runtimev1alpha1.WorkloadAutoRegistrationSpec{
			Identity: fixtures.AWSIdentity("i-1234567890abcdef0"),
			Registration: runtimev1alpha1.Registration{
				Agent: runtimev1alpha1.AgentInfo{Version: "v1.4.0"},
				Host: runtimev1alpha1.HostInfo{Addresses: []runtimev1alpha1.HostAddress{
					{IP: "172.31.5.254", Type: runtimev1alpha1.AddressTypeVPC},
				}},
				Settings: runtimev1alpha1.Settings{ConnectedOver: runtimev1alpha1.AddressTypeVPC},
				Sidecar:  runtimev1alpha1.SidecarInfo{Istio: runtimev1alpha1.IstioSidecarInfo{Version: "1.9.8-15bc6e5e32"}},
				Workload: runtimev1alpha1.WorkloadInfo{Labels: map[string]string{"version": "v5"}},
			},
			WorkloadGroup: runtimev1alpha1.WorkloadGroupSnapshot{
				Name: "ratings", UID: "d01777d5-4294-44e7-a311-3596c2f63bb1", Generation: 1,
				Spec: runtime.RawExtension{Raw: spec},
			},
		},
	}
}

func TestWorkloadAutoRegistrationRoundTripsWithStatus(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	war := seedWAR(t, ns)
	// Status sent with a create is dropped: only the status subresource writes it.
	war.Status.ObservedGeneration = 42
	if err := env.Client.Create(ctx, war); err != nil {
		t.Fatalf("create: %v", err)
	}
	if war.Status.ObservedGeneration != 0 {
		t.Errorf("status written through the main resource: %+v", war.Status)
	}
	if war.Generation != 1 {
		t.Fatalf("generation = %d, want 1", war.Generation)
	}

	transition := metav1.NewTime(time.Date(2021, 10, 9, 10, 56, 41, 0, time.UTC))
	war.Status = runtimev1alpha1.WorkloadAutoRegistrationStatus{
		ObservedGeneration: war.Generation,
		Conditions: []metav1.Condition{{
			Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionTrue,
			Reason: runtimev1alpha1.ReasonAgentEstablishedConnection, LastTransitionTime: transition,
			ObservedGeneration: war.Generation,
		}},
		Connection: &runtimev1alpha1.ConnectionStatus{Replica: "embark-0", ConnectedAt: &transition},
	}
	if err := env.Client.Status().Update(ctx, war); err != nil {
		t.Fatalf("update status: %v", err)
	}
	if war.Generation != 1 {
		t.Errorf("a status write changed generation to %d", war.Generation)
	}

	got := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(war), got); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(got.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != runtimev1alpha1.ReasonAgentEstablishedConnection || !cond.LastTransitionTime.Equal(&transition) {
		t.Errorf("AgentConnected condition = %+v", cond)
	}
	if got.Status.Connection == nil || got.Status.Connection.Replica != "embark-0" {
		t.Errorf("connection = %+v", got.Status.Connection)
	}
	if got.Spec.Identity.AWS.EC2.InstanceID != "i-1234567890abcdef0" || got.Spec.Registration.Host.Addresses[0].IP != "172.31.5.254" {
		t.Errorf("spec = %+v", got.Spec)
	}
	var snap map[string]any
	if err := json.Unmarshal(got.Spec.WorkloadGroup.Spec.Raw, &snap); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if snap["template"].(map[string]any)["serviceAccount"] != "ratings-vm" {
		t.Errorf("WorkloadGroup snapshot stored as %s", got.Spec.WorkloadGroup.Spec.Raw)
	}

	// A write through the main resource cannot touch status, and one built on
	// a stale resourceVersion conflicts.
	stale := got.DeepCopy()
	got.Status.Connection.Replica = "someone-else"
	got.Spec.Registration.Agent.Version = "v1.5.0"
	if err := env.Client.Update(ctx, got); err != nil {
		t.Fatalf("update: %v", err)
	}
	if got.Generation != 2 || got.Status.Connection.Replica != "embark-0" {
		t.Errorf("after a spec update: generation %d, replica %q", got.Generation, got.Status.Connection.Replica)
	}
	stale.Status.Connection.Replica = "embark-1"
	if err := env.Client.Status().Update(ctx, stale); !apierrors.IsConflict(err) {
		t.Errorf("status update with a stale resourceVersion: %v, want a conflict", err)
	}
}

func TestKubectlGetWarPrintsSeedColumns(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	war := seedWAR(t, ns)
	if err := env.Client.Create(ctx, war); err != nil {
		t.Fatal(err)
	}
	war.Status.Conditions = []metav1.Condition{{
		Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionTrue,
		Reason: runtimev1alpha1.ReasonAgentEstablishedConnection, LastTransitionTime: metav1.Now(),
	}}
	if err := env.Client.Status().Update(ctx, war); err != nil {
		t.Fatal(err)
	}

	out, err := env.Kubectl(ctx, nil, "get", "war", "-A")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if got := strings.Join(strings.Fields(lines[0]), " "); got != "NAMESPACE NAME AGENT CONNECTED AGE" {
		t.Errorf("header = %q, want the seed's NAMESPACE NAME AGENT CONNECTED AGE", lines[0])
	}
	row := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ns) + `\s+` + seedWARName + `\s+True\s+\d+s$`)
	if !row.MatchString(out) {
		t.Errorf("no row for %s/%s with AGENT CONNECTED True in:\n%s", ns, seedWARName, out)
	}

	// The long form is reachable too, and describe shows the seed's fields.
	if _, err := env.Kubectl(ctx, nil, "get", "workloadautoregistrations.runtime.onboarding.tetrate.io", "-n", ns, seedWARName); err != nil {
		t.Errorf("get by full resource name: %v", err)
	}
	desc, err := env.Kubectl(ctx, nil, "describe", "war", "-n", ns, seedWARName)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range [][2]string{
		{"API Version", "runtime.onboarding.tetrate.io/v1alpha1"},
		{"Kind", "WorkloadAutoRegistration"},
		{"Account", "123456789012"},
		{"Instance Id", "i-1234567890abcdef0"},
		{"Partition", "aws"},
		{"Region", "us-east-2"},
		{"Zone", "us-east-2b"},
		{"Ip", "172.31.5.254"},
		{"Connected Over", "VPC"},
		{"Version", "1.9.8-15bc6e5e32"},
		{"Reason", "AgentEstablishedConnection"},
		{"Type", "AgentConnected"},
	} {
		line := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(want[0]) + `:\s+` + regexp.QuoteMeta(want[1]) + `$`)
		if !line.MatchString(desc) {
			t.Errorf("kubectl describe war lacks %q: %q:\n%s", want[0], want[1], desc)
		}
	}
}

// kubectl get obp (the short name) prints the policy's columns: groups
// selected, accounts, issuers, when it last allowed and denied, age; -o
// wide adds the selected groups' names; all from the status subresource.
func TestKubectlGetObpPrintsColumns(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	data, err := os.ReadFile("testdata/seed004/policy-any-ec2-in-accounts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := &authorizationv1alpha1.OnboardingPolicy{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		t.Fatal(err)
	}
	p.Namespace = ns
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	allowed := metav1.NewTime(time.Now().Add(-90 * time.Second).Truncate(time.Second))
	p.Status = authorizationv1alpha1.OnboardingPolicyStatus{
		ObservedGeneration: p.Generation, SelectedWorkloadGroups: []string{"details", "ratings"},
		SelectedWorkloadGroupCount: 2, LastAllowedTime: &allowed,
	}
	if err := env.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		args   []string
		header string
		row    string
	}{
		{args: []string{"get", "obp", "-n", ns}, header: "NAME GROUPS ACCOUNTS PROJECTS SUBSCRIPTIONS ISSUERS LAST ALLOWED LAST DENIED AGE",
			row: `^` + regexp.QuoteMeta(p.Name) + `\s+2\s+\["123456789012","234567890123"\]\s+(9\d|1\d\d)s\s+\d+s$`}, // no issuer, never denied: empty
		{args: []string{"get", "obp", "-n", ns, "-o", "wide"}, header: "NAME GROUPS ACCOUNTS PROJECTS SUBSCRIPTIONS ISSUERS LAST ALLOWED LAST DENIED SELECTED AGE",
			row: `^` + regexp.QuoteMeta(p.Name) + `\s+2\s+.*\s+\["details","ratings"\]\s+\d+s$`},
	} {
		out, err := env.Kubectl(ctx, nil, tc.args...)
		if err != nil {
			t.Fatalf("kubectl %v: %v", tc.args, err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if got := strings.Join(strings.Fields(lines[0]), " "); got != tc.header {
			t.Errorf("kubectl %v header = %q, want %q", tc.args, got, tc.header)
		}
		if !regexp.MustCompile(`(?m)` + tc.row).MatchString(out) {
			t.Errorf("kubectl %v: no row matching %s in:\n%s", tc.args, tc.row, out)
		}
	}
}

func TestInvalidResourcesAreRefusedNamingTheField(t *testing.T) {
	ns := env.Namespace(t)
	policy := func(aws string) string {
		return `apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: p
  namespace: ` + ns + `
spec:
  allow:
  - workloads:
    - ` + aws + `
    onboardTo:
    - workloadGroupSelector: {}
`
	}
	tests := []struct {
		name    string
		yaml    string
		wantErr []string
	}{
		{
			name:    "aws rule without accounts",
			yaml:    policy(`aws: {regions: [us-east-2], ec2: {}}`),
			wantErr: []string{"spec.allow[0].workloads[0].aws.accounts", "Required value"},
		},
		{
			name:    "aws rule with an empty account list",
			yaml:    policy(`aws: {accounts: [], ec2: {}}`),
			wantErr: []string{"spec.allow[0].workloads[0].aws.accounts", "at least 1 item"},
		},
		{
			name:    "malformed account ID",
			yaml:    policy(`aws: {accounts: ['12345']}`),
			wantErr: []string{"spec.allow[0].workloads[0].aws.accounts[0]", `"12345"`},
		},
		{
			name:    "wildcard account",
			yaml:    policy(`aws: {accounts: ['*']}`),
			wantErr: []string{"spec.allow[0].workloads[0].aws.accounts[0]"},
		},
		{
			name:    "unknown field",
			yaml:    policy(`aws: {accounts: ['123456789012'], acounts: ['234567890123']}`),
			wantErr: []string{`unknown field "spec.allow[0].workloads[0].aws.acounts"`},
		},
		{
			name:    "unknown partition",
			yaml:    policy(`aws: {accounts: ['123456789012'], partitions: [amazon]}`),
			wantErr: []string{"spec.allow[0].workloads[0].aws.partitions[0]", "Unsupported value"},
		},
		{
			name:    "aws and jwt in one matcher",
			yaml:    policy(`{aws: {accounts: ['123456789012']}, jwt: {issuer: 'https://issuer.example'}}`),
			wantErr: []string{"spec.allow[0].workloads[0]", "exactly one of aws, jwt, gcp, azure or ecs must be set"},
		},
		{
			name:    "empty matcher",
			yaml:    policy(`{}`),
			wantErr: []string{"spec.allow[0].workloads[0]", "exactly one of aws, jwt, gcp, azure or ecs must be set"},
		},
		{
			name:    "gcp and aws in one matcher",
			yaml:    policy(`{aws: {accounts: ['123456789012']}, gcp: {projects: [my-project]}}`),
			wantErr: []string{"spec.allow[0].workloads[0]", "exactly one of aws, jwt, gcp, azure or ecs must be set"},
		},
		{
			name:    "ecs and aws in one matcher",
			yaml:    policy(`{aws: {accounts: ['123456789012']}, ecs: {accounts: ['123456789012']}}`),
			wantErr: []string{"spec.allow[0].workloads[0]", "exactly one of aws, jwt, gcp, azure or ecs must be set"},
		},
		{
			name:    "ecs without accounts",
			yaml:    policy(`ecs: {clusters: [prod]}`),
			wantErr: []string{"spec.allow[0].workloads[0].ecs.accounts", "Required value"},
		},
		{
			name:    "ecs with a malformed cluster name",
			yaml:    policy(`ecs: {accounts: ['123456789012'], clusters: ['prod/eu']}`),
			wantErr: []string{"spec.allow[0].workloads[0].ecs.clusters[0]"},
		},
		{
			name:    "gcp without projects",
			yaml:    policy(`gcp: {zones: [us-central1-a]}`),
			wantErr: []string{"spec.allow[0].workloads[0].gcp.projects", "Required value"},
		},
		{
			name:    "gcp project ID not an ID",
			yaml:    policy(`gcp: {projects: ['My Project']}`),
			wantErr: []string{"spec.allow[0].workloads[0].gcp.projects[0]"},
		},
		{
			name:    "azure and gcp in one matcher",
			yaml:    policy(`{gcp: {projects: [my-project]}, azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47], subscriptions: [0b1f6471-1bf0-4dda-aec3-cb9272f09590]}}`),
			wantErr: []string{"spec.allow[0].workloads[0]", "exactly one of aws, jwt, gcp, azure or ecs must be set"},
		},
		{
			name:    "azure without subscriptions",
			yaml:    policy(`azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47]}`),
			wantErr: []string{"spec.allow[0].workloads[0].azure.subscriptions", "Required value"},
		},
		{
			name:    "azure tenant not an ID",
			yaml:    policy(`azure: {tenants: [contoso.onmicrosoft.com], subscriptions: [0b1f6471-1bf0-4dda-aec3-cb9272f09590]}`),
			wantErr: []string{"spec.allow[0].workloads[0].azure.tenants[0]"},
		},
		{
			name:    "azure resourceGroups: []",
			yaml:    policy(`azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47], subscriptions: [0b1f6471-1bf0-4dda-aec3-cb9272f09590], resourceGroups: []}`),
			wantErr: []string{"spec.allow[0].workloads[0].azure.resourceGroups"},
		},
		{
			name:    "azure locations: []",
			yaml:    policy(`azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47], subscriptions: [0b1f6471-1bf0-4dda-aec3-cb9272f09590], locations: []}`),
			wantErr: []string{"spec.allow[0].workloads[0].azure.locations"},
		},
		{
			name: "missing workloadGroupSelector",
			yaml: `apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata: {name: p, namespace: ` + ns + `}
spec:
  allow:
  - workloads: [{aws: {accounts: ['123456789012']}}]
    onboardTo: [{}]
`,
			wantErr: []string{"spec.allow[0].onboardTo[0].workloadGroupSelector", "Required value"},
		},
		{
			name: "registration with a malformed address and instance ID",
			yaml: `apiVersion: runtime.onboarding.tetrate.io/v1alpha1
kind: WorkloadAutoRegistration
metadata: {name: w, namespace: ` + ns + `}
spec:
  identity: {aws: {partition: aws, account: '123456789012', region: us-east-2, zone: us-east-2b, ec2: {instanceId: 'x-1'}}}
  registration: {host: {addresses: [{ip: '300.1.1.1', type: VPC}]}}
  workloadGroup: {name: ratings, spec: {}}
`,
			wantErr: []string{"spec.identity.aws.ec2.instanceId", "spec.registration.host.addresses[0].ip", "must be an IPv4 or IPv6 address"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := env.Kubectl(t.Context(), []byte(tt.yaml), "apply", "-f", "-")
			if err == nil {
				t.Fatalf("accepted:\n%s", tt.yaml)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// Clients other than kubectl get the same refusal, and with strict field
// validation an unknown field is an error rather than silently pruned.
func TestAPIClientsGetTheSameValidation(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	p := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "no-accounts", Namespace: ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Regions: []string{"us-east-2"}}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
		}}},
	}
	err := env.Client.Create(ctx, p)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.allow[0].workloads[0].aws.accounts") {
		t.Errorf("create without accounts: %v, want Invalid naming the accounts field", err)
	}

	u := map[string]any{}
	if err := yaml.Unmarshal([]byte(`apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata: {name: typo}
spec:
  allow:
  - workloads: [{aws: {accounts: ['123456789012']}}]
    onboardTo: [{workloadGroupSelector: {}}]
    extra: true
`), &u); err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{Object: u}
	obj.SetNamespace(ns)
	err = env.Client.Create(ctx, obj, client.FieldValidation(metav1.FieldValidationStrict))
	if err == nil || !strings.Contains(err.Error(), `unknown field "spec.allow[0].extra"`) {
		t.Errorf("strict create with an unknown field: %v", err)
	}
	// Without strict validation the unknown field is pruned: never stored.
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	stored := &unstructured.Unstructured{Object: map[string]any{"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind()}}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "typo"}, stored); err != nil {
		t.Fatal(err)
	}
	rule := stored.Object["spec"].(map[string]any)["allow"].([]any)[0].(map[string]any)
	if _, kept := rule["extra"]; kept {
		t.Errorf("unknown field was stored: %v", rule)
	}
}

// manifests/ (kustomize) installs exactly the generated CRDs, and the API
// server accepts them as they are (manifests/ tests the rest it installs in
// istio-system).
func TestManifestsInstallTheGeneratedCRDs(t *testing.T) {
	ctx := t.Context()
	out, err := env.Kubectl(ctx, nil, "kustomize", "../../manifests")
	if err != nil {
		t.Fatal(err)
	}
	// The manifests hold objects of istio-system and of the example
	// namespace bookinfo.
	for _, ns := range []string{"istio-system", "bookinfo"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	applied, err := env.Kubectl(ctx, []byte(out), "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	crdList, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crdList {
		if !strings.Contains(applied, "customresourcedefinition.apiextensions.k8s.io/"+crd.Name) {
			t.Errorf("manifests do not install %s:\n%s", crd.Name, applied)
		}
	}
	if got := strings.Count(out, "kind: CustomResourceDefinition"); got != len(crdList) {
		t.Errorf("manifests hold %d CRDs, api/crds %d", got, len(crdList))
	}
}
