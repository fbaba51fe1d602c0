package adversarial

import (
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"google.golang.org/grpc/codes"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/onboarding/identity/ecs"
)

// ecsWorld is an endpoint accepting ECS task credentials (STS of the
// harness's AWS), with or without the ECS API check against a loopback ECS,
// and one RUNNING task (role ratings-task, cluster prod).
type ecsWorld struct {
	*onboarding
	api  *awstest.ECS
	task awstest.Task
}

func newECSWorld(t *testing.T, check bool) *ecsWorld {
	t.Helper()
	api := awstest.NewECS()
	t.Cleanup(api.Close)
	var checker ecs.TaskChecker
	if check {
		clients, err := ecs.NewClients(t.Context(), ecs.ClientOptions{ECSEndpoint: api.URL,
			Credentials: credentials.NewStaticCredentialsProvider(api.AccessKeyID, api.SecretAccessKey, "")})
		if err != nil {
			t.Fatal(err)
		}
		if checker, err = ecs.NewChecker(ecs.CheckerOptions{Clients: clients}); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(sv *awsidentity.Verifier) endpoint.ECSVerifier {
		v, err := ecs.NewVerifier(sv, checker)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	w := &ecsWorld{onboarding: newOnboarding(t, onboardingOptions{ecs: mk, detailed: true}), api: api}
	w.task = api.Put(awstest.Task{Role: "ratings-task"})
	w.group("ratings")
	return w
}

// sessionOf signs sts:GetCallerIdentity with credentials of the role
// session <role>/<session> of account.
func (w *ecsWorld) sessionOf(account, role, session string) *awsidentity.STSRequest {
	w.t.Helper()
	c := w.aws.STS.IssueRole("aws", account, role, session, time.Hour)
	sc := sts.New(sts.Options{Region: "us-east-2", BaseEndpoint: &w.aws.STS.URL,
		Credentials: sdkaws.NewCredentialsCache(credentials.NewStaticCredentialsProvider(c.AccessKeyID, c.SecretAccessKey, c.SessionToken))})
	req, err := awsclient.SignGetCallerIdentity(w.t.Context(), sc, audience)
	if err != nil {
		w.t.Fatal(err)
	}
	return req
}

// claim is the credential of task t signed by req.
func claim(t awstest.Task, req *awsidentity.STSRequest) *awswire.ECSCredential {
	return &awswire.ECSCredential{STS: req, Cluster: t.ClusterARN(), TaskARN: t.ARN(), Family: t.Family, Revision: "3",
		AvailabilityZone: t.Zone, Address: t.Address}
}

func (w *ecsWorld) authorize(cred *awswire.ECSCredential) (*onboardingv1alpha1.AuthorizeResponse, error) {
	return w.client.Authorize(w.t.Context(), &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: w.ns, Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Ecs{Ecs: awswire.ECSToProto(cred)},
	})
}

func ecsRule(m authorizationv1alpha1.ECSMatcher) authorizationv1alpha1.AllowRule {
	return authorizationv1alpha1.AllowRule{Workloads: []authorizationv1alpha1.WorkloadMatcher{{ECS: &m}}, OnboardTo: []authorizationv1alpha1.OnboardTarget{{}}}
}

// Anyone can run a task with a task role in their own account: its role
// session is genuine. It must not onboard where the policy names another
// account, nor where only aws (EC2) rules exist, nor spend the endpoint's
// rate-limited ECS API calls (which would make legitimate tasks wait).
func TestECSTaskOfAnotherAccountOnboards(t *testing.T) {
	Attack(t, "a genuine ECS task role session of the attacker's own account onboards, or spends the endpoint's ECS API calls")
	w := newECSWorld(t, true)
	w.policy("ec2-and-ecs", anyEC2(), ecsRule(authorizationv1alpha1.ECSMatcher{Accounts: []string{"123456789012"}}))
	attacker := awstest.Task{Account: "999999999999", Region: "us-east-2", Cluster: "prod", TaskID: "0123456789abcdef", Zone: "us-east-2b", Family: "x", Address: "10.0.3.17"}
	_, err := w.authorize(claim(attacker, w.sessionOf("999999999999", "ratings-task", attacker.TaskID)))
	wantCode(t, "authorize", err, codes.PermissionDenied, "account 999999999999 not in [123456789012]")
	assertNoRegistrations(t, w.ns)
	if n := w.api.Calls("DescribeTasks"); n != 0 {
		t.Errorf("the attacker's task cost %d ECS DescribeTasks calls, want 0", n)
	}

	res, err := w.authorize(claim(w.task, w.sessionOf(w.task.Account, "ratings-task", w.task.TaskID)))
	if err != nil {
		t.Fatalf("the account's own task: %v", err)
	}
	if want := "ratings-aws-aws-123456789012-us-east-2-ecs-prod-" + w.task.TaskID; res.GetRegistrationName() != want {
		t.Errorf("registration name %q, want %q", res.GetRegistrationName(), want)
	}
}

// A task (or anyone holding its role credentials) claims to be another
// task: its role session is named after itself, not the claimed task.
func TestECSTaskClaimsAnotherTask(t *testing.T) {
	Attack(t, "an ECS task's role session claims another task of its account")
	w := newECSWorld(t, false)
	w.policy("ecs", ecsRule(authorizationv1alpha1.ECSMatcher{Accounts: []string{"123456789012"}}))
	victim := w.api.Put(awstest.Task{Role: "ratings-task", Address: "10.0.3.99"})
	_, err := w.authorize(claim(victim, w.sessionOf(w.task.Account, "ratings-task", w.task.TaskID)))
	wantCode(t, "authorize", err, codes.Unauthenticated, "TaskMismatch", w.task.TaskID)
	assertNoRegistrations(t, w.ns)
}

// Task role credentials stay valid for hours after they were served: a
// stopped task's leaked credentials sign a fresh request.
func TestECSStoppedTaskCredentialsOnboard(t *testing.T) {
	Attack(t, "the still-valid role credentials of a stopped ECS task onboard it")
	w := newECSWorld(t, true)
	w.policy("ecs", ecsRule(authorizationv1alpha1.ECSMatcher{Accounts: []string{"123456789012"}, Clusters: []string{"prod"}}))
	stopped := w.task
	stopped.LastStatus, stopped.DesiredStatus = "STOPPED", "STOPPED"
	w.api.Put(stopped)
	_, err := w.authorize(claim(stopped, w.sessionOf(stopped.Account, "ratings-task", stopped.TaskID)))
	wantCode(t, "authorize", err, codes.Unauthenticated, "TaskNotRunning", "STOPPED")
	assertNoRegistrations(t, w.ns)
}

// Without the ECS API check the cluster in the claimed task ARN is the
// agent's word: a task of cluster dev writes prod into it.
func TestECSUnconfirmedTaskClaimsACluster(t *testing.T) {
	Attack(t, "an ECS task writes the policy's cluster into its claimed task ARN where the endpoint does not ask ECS")
	w := newECSWorld(t, false)
	w.policy("ecs-prod", ecsRule(authorizationv1alpha1.ECSMatcher{Accounts: []string{"123456789012"}, Clusters: []string{"prod"}}))
	devTask := awstest.Task{Role: "ratings-task", Cluster: "dev"}
	devTask = w.api.Put(devTask)
	claimed := devTask
	claimed.Cluster = "prod"
	_, err := w.authorize(claim(claimed, w.sessionOf(devTask.Account, "ratings-task", devTask.TaskID)))
	wantCode(t, "authorize", err, codes.PermissionDenied, "task not confirmed by the ECS API")
	assertNoRegistrations(t, w.ns)
}

// A confirmed task registers another workload's address (to take its
// traffic), and an unconfirmed one registers its own claimed address.
func TestECSTaskRegistersAnotherAddress(t *testing.T) {
	Attack(t, "an ECS task registers an address the ECS API does not report for its ENI")
	w := newECSWorld(t, true)
	w.policy("ecs", ecsRule(authorizationv1alpha1.ECSMatcher{Accounts: []string{"123456789012"}}))
	res, err := w.authorize(claim(w.task, w.sessionOf(w.task.Account, "ratings-task", w.task.TaskID)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.register(res.GetToken(), "", "10.0.3.99", "VPC")
	wantCode(t, "register", err, codes.PermissionDenied, "10.0.3.99", "not proven", "ENI address 10.0.3.17")
	assertNoRegistrations(t, w.ns)
	if _, err := w.register(res.GetToken(), "", w.task.Address, "VPC"); err != nil {
		t.Fatalf("the task's own ENI address: %v", err)
	}
}

// A signed request seen once (in a log, by a proxy) is presented again.
func TestECSSignedRequestReplayed(t *testing.T) {
	Attack(t, "a captured ECS task's signed sts:GetCallerIdentity request is presented a second time")
	w := newECSWorld(t, false)
	w.policy("ecs", ecsRule(authorizationv1alpha1.ECSMatcher{Accounts: []string{"123456789012"}}))
	cred := claim(w.task, w.sessionOf(w.task.Account, "ratings-task", w.task.TaskID))
	if _, err := w.authorize(cred); err != nil {
		t.Fatalf("first use: %v", err)
	}
	_, err := w.authorize(cred)
	wantCode(t, "replay", err, codes.Unauthenticated, "STSReplayed")
}
