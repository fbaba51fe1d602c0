package integration

import (
	"regexp"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	endpointconfig "github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
)

// An ECS task onboards with its task role: the real agent (platform ecs,
// detected from ECS_CONTAINER_METADATA_URI_V4) reads the task from a
// loopback task metadata endpoint v4, gets the task role's credentials from
// a loopback container credentials endpoint with the SDK's provider and
// signs sts:GetCallerIdentity; the real endpoint sends it to the loopback
// STS, confirms the task with a loopback ECS API (identity.ecs.taskCheck)
// and the policy's ecs rule allows it. The ENI address is proven by the
// ECS API, so the rule needs no addressCIDRs. kubectl describe war shows the
// ECS identity.
func TestECSTaskOnboards(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	// The endpoint asks ECS with its own credentials (the SDK's default
	// chain: the pair newWorld put in the environment).
	api := awstest.NewECS(awstest.WithECSKey(w.aws.EC2IAM.AccessKeyID, w.aws.EC2IAM.SecretAccessKey))
	t.Cleanup(api.Close)
	task := api.Put(awstest.Task{Role: "ratings-task", TaskID: "158d1c8083dd49d6b527399fd6414f5c"})
	md := awstest.NewTaskMetadata(task, w.aws.STS, "task-auth-token")
	t.Cleanup(md.Close)

	w.cfg.Identity.ECS = &endpointconfig.ECSIdentity{TaskCheck: &endpointconfig.ECSTaskCheck{ECSEndpoint: api.URL}}
	policy := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "ecs", Namespace: w.ns},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{ECS: &authorizationv1alpha1.ECSMatcher{
				Accounts: []string{task.Account}, Regions: []string{task.Region}, Zones: []string{task.Zone},
				Clusters: []string{task.Cluster}, TaskRoles: []string{task.Role},
			}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: metav1.LabelSelector{}}},
		}}},
	}
	must(t, env.Client.Create(ctx, policy))
	w.startEndpoint()

	t.Setenv(platform.EnvECSMetadataURIV4, md.MetadataURI)
	t.Setenv(platform.EnvContainerCredentialsRel, "")
	t.Setenv(platform.EnvContainerCredentialsFull, md.CredentialsURI)
	t.Setenv(platform.EnvContainerAuthToken, md.AuthorizationToken)
	a := w.runAgent(agentRun{})
	if a.platform.Name() != config.PlatformECS {
		t.Fatalf("detected platform %s, want ecs", a.platform.Name())
	}

	fixtures.Eventually(t, 60*time.Second, "the ECS task registered", func() bool { return len(w.registrations()) == 1 })
	war := w.registrations()[0]
	want := runtimev1alpha1.ECSIdentity{
		Partition: "aws", Account: task.Account, Region: task.Region, Zone: task.Zone, Cluster: task.Cluster,
		TaskARN: task.ARN(), TaskID: task.TaskID, TaskRole: task.Role, Family: "ratings", Revision: "3", TaskConfirmed: true,
	}
	if id := war.Spec.Identity.ECS; id == nil || *id != want || war.Spec.Identity.AWS != nil {
		t.Fatalf("registration identity %+v, want ecs %+v", war.Spec.Identity, want)
	}
	if wantName := "ratings-aws-aws-123456789012-us-east-2-ecs-prod-158d1c8083dd49d6b527399fd6414f5c"; war.Name != wantName || war.Name != registry.Name("ratings", war.Spec.Identity) {
		t.Errorf("registration name %s, want %s", war.Name, wantName)
	}
	if addrs := war.Spec.Registration.Host.Addresses; len(addrs) != 1 || addrs[0].IP != task.Address {
		t.Errorf("addresses %+v, want the task's ENI address %s", addrs, task.Address)
	}
	if api.Calls("DescribeTasks") == 0 {
		t.Error("the endpoint did not ask ECS about the task")
	}

	desc, err := env.Kubectl(ctx, nil, "describe", "war", "-n", w.ns, war.Name)
	must(t, err)
	for _, f := range [][2]string{
		{"Account", task.Account}, {"Region", task.Region}, {"Zone", task.Zone}, {"Cluster", task.Cluster},
		{"Task Arn", task.ARN()}, {"Task Id", task.TaskID}, {"Task Role", task.Role},
		{"Family", "ratings"}, {"Revision", "3"}, {"Task Confirmed", "true"},
	} {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(f[0]) + `:\s+` + regexp.QuoteMeta(f[1]) + `$`).MatchString(desc) {
			t.Errorf("kubectl describe war lacks %q: %q:\n%s", f[0], f[1], desc)
		}
	}
}
