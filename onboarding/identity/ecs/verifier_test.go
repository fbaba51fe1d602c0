package ecs_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/credentials/endpointcreds"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	"github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/onboarding/identity/ecs"
)

const audience = "onboarding.example.com"

// fixture is an STS, an ECS API and one RUNNING task (role ratings-task in
// cluster prod of account 123456789012) with its task metadata and
// credentials endpoints, all loopback fakes driven by the real SDK.
type fixture struct {
	sts  *awstest.STS
	api  *awstest.ECS
	meta *awstest.TaskMetadata
	task awstest.Task
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	f := &fixture{sts: awstest.NewSTS(), api: awstest.NewECS()}
	t.Cleanup(f.sts.Close)
	t.Cleanup(f.api.Close)
	f.task = f.api.Put(awstest.Task{Role: "ratings-task"})
	f.meta = awstest.NewTaskMetadata(f.task, f.sts, "embark-test-token")
	t.Cleanup(f.meta.Close)
	return f
}

func (f *fixture) checker(t *testing.T, opts ecs.CheckerOptions) *ecs.Checker {
	t.Helper()
	clients, err := ecs.NewClients(t.Context(), ecs.ClientOptions{ECSEndpoint: f.api.URL,
		Credentials: credentials.NewStaticCredentialsProvider(f.api.AccessKeyID, f.api.SecretAccessKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	opts.Clients = clients
	c, err := ecs.NewChecker(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fixture) verifier(t *testing.T, check bool, opts ...awsid.Option) *ecs.Verifier {
	t.Helper()
	sv, err := awsid.NewVerifier(audience, append([]awsid.Option{awsid.WithSTSEndpoint(f.sts.URL)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	var tc ecs.TaskChecker
	if check {
		tc = f.checker(t, ecs.CheckerOptions{})
	}
	v, err := ecs.NewVerifier(sv, tc)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// sign signs sts:GetCallerIdentity for stsURL and aud with provider, as the
// agent does.
func sign(t *testing.T, provider sdkaws.CredentialsProvider, stsURL, aud string) *awsid.STSRequest {
	t.Helper()
	c := sts.New(sts.Options{Region: "us-east-2", BaseEndpoint: &stsURL, Credentials: sdkaws.NewCredentialsCache(provider)})
	req, err := client.SignGetCallerIdentity(t.Context(), c, aud)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// taskRole is the SDK's container credential provider reading the task
// role's credentials from the task's credentials endpoint (full URI and
// authorization token).
func (f *fixture) taskRole() sdkaws.CredentialsProvider {
	return endpointcreds.New(f.meta.CredentialsURI, func(o *endpointcreds.Options) { o.AuthorizationToken = f.meta.AuthorizationToken })
}

func static(c awstest.Credentials) sdkaws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider(c.AccessKeyID, c.SecretAccessKey, c.SessionToken)
}

// credential is what the task's agent presents.
func (f *fixture) credential(t *testing.T) ecs.Credential {
	t.Helper()
	task := f.meta.Task()
	return ecs.Credential{
		STS: sign(t, f.taskRole(), f.sts.URL, audience), Cluster: task.ClusterARN(), TaskARN: task.ARN(),
		Family: task.Family, Revision: "3", AvailabilityZone: task.Zone, Address: task.Address,
	}
}

func TestGenuineTask(t *testing.T) {
	f := newFixture(t)
	for _, check := range []bool{true, false} {
		id, err := f.verifier(t, check).Verify(t.Context(), f.credential(t))
		if err != nil {
			t.Fatalf("check=%v: Verify() = %v", check, err)
		}
		e := id.ECS
		if id.Method != identity.MethodECSTaskRole || e == nil || id.AWS != nil {
			t.Fatalf("check=%v: identity %+v, want an ECS identity", check, id)
		}
		want := identity.ECSIdentity{
			Partition: "aws", Account: "123456789012", Region: "us-east-2", Zone: "us-east-2b", Cluster: "prod",
			TaskARN: f.task.ARN(), TaskID: f.task.TaskID, TaskRole: "ratings-task",
			CallerARN: awstest.AssumedRoleARN("aws", "123456789012", "ratings-task", f.task.TaskID),
			Family:    "ratings", Revision: "3",
		}
		if check {
			want.Address, want.TaskConfirmed = "10.0.3.17", true
		}
		if *e != want {
			t.Errorf("check=%v: identity\n %+v, want\n %+v", check, *e, want)
		}
	}
}

// Each forgery is refused with its reason, with the ECS API check on.
func TestForgeries(t *testing.T) {
	f := newFixture(t)
	otherTask := f.api.Put(awstest.Task{Role: "ratings-task", Address: "10.0.3.99"})
	tests := []struct {
		name  string
		edit  func(t *testing.T, c *ecs.Credential)
		setup func()
		check bool
		want  identity.Reason
	}{
		{name: "no STS proof", edit: func(_ *testing.T, c *ecs.Credential) { c.STS = nil }, want: identity.ReasonMalformed},
		{name: "not a task ARN", edit: func(_ *testing.T, c *ecs.Credential) {
			c.TaskARN = "arn:aws:ecs:us-east-2:123456789012:service/prod/ratings"
		}, want: identity.ReasonMalformed},
		{name: "a task of another account", edit: func(_ *testing.T, c *ecs.Credential) {
			c.TaskARN = awstest.Task{Account: "999999999999", Region: "us-east-2", Cluster: "prod", TaskID: f.task.TaskID}.ARN()
		}, want: identity.ReasonAccountMismatch},
		{name: "another task's role session (another task ID)", edit: func(_ *testing.T, c *ecs.Credential) {
			c.TaskARN, c.Address = otherTask.ARN(), otherTask.Address
		}, want: identity.ReasonTaskMismatch},
		{name: "a session of the role not named after the task", edit: func(t *testing.T, c *ecs.Credential) {
			c.STS = sign(t, static(f.sts.IssueRole("aws", "123456789012", "ratings-task", "alice", time.Hour)), f.sts.URL, audience)
		}, want: identity.ReasonTaskMismatch},
		{name: "another role's session named after the task", check: true, edit: func(t *testing.T, c *ecs.Credential) {
			c.STS = sign(t, static(f.sts.IssueRole("aws", "123456789012", "admin", f.task.TaskID, time.Hour)), f.sts.URL, audience)
		}, want: identity.ReasonTaskMismatch},
		{name: "an IAM user, not an assumed-role session", edit: func(t *testing.T, c *ecs.Credential) {
			c.STS = sign(t, static(f.sts.Issue(awstest.Principal{ARN: "arn:aws:iam::123456789012:user/alice", Account: "123456789012", UserID: "AIDAALICE"}, time.Hour)), f.sts.URL, audience)
		}, want: identity.ReasonNotAssumedRole},
		{name: "claimed cluster is not the task ARN's", edit: func(_ *testing.T, c *ecs.Credential) { c.Cluster = "dev" }, want: identity.ReasonTaskMismatch},
		{name: "the task moved to another cluster in its ARN", check: true, edit: func(_ *testing.T, c *ecs.Credential) {
			moved := f.task
			moved.Cluster = "dev"
			c.TaskARN, c.Cluster = moved.ARN(), "dev"
		}, want: identity.ReasonTaskNotRunning},
		{name: "a stopped task", check: true, setup: func() {
			s := f.task
			s.LastStatus, s.DesiredStatus = "STOPPED", "STOPPED"
			f.api.Put(s)
		}, want: identity.ReasonTaskNotRunning},
		{name: "a stopping task", check: true, setup: func() {
			s := f.task
			s.DesiredStatus = "STOPPED"
			f.api.Put(s)
		}, want: identity.ReasonTaskNotRunning},
		{name: "another ENI address", check: true, edit: func(_ *testing.T, c *ecs.Credential) { c.Address = "10.0.9.9" }, want: identity.ReasonTaskMismatch},
		{name: "another zone", check: true, edit: func(_ *testing.T, c *ecs.Credential) { c.AvailabilityZone = "us-east-2c" }, want: identity.ReasonTaskMismatch},
		{name: "a zone of another region", edit: func(_ *testing.T, c *ecs.Credential) { c.AvailabilityZone = "eu-west-1a" }, want: identity.ReasonMalformed},
		{name: "another task definition", check: true, edit: func(_ *testing.T, c *ecs.Credential) { c.Family = "admin" }, want: identity.ReasonTaskMismatch},
		{name: "signed for another onboarding endpoint", edit: func(t *testing.T, c *ecs.Credential) {
			c.STS = sign(t, f.taskRole(), f.sts.URL, "other.example.com")
		}, want: identity.ReasonSTSUnbound},
		{name: "signed for another STS endpoint", edit: func(t *testing.T, c *ecs.Credential) {
			c.STS = sign(t, f.taskRole(), "https://sts.attacker.example", audience)
		}, want: identity.ReasonSTSRequestInvalid},
		{name: "a claim edited after signing (audience header)", edit: func(_ *testing.T, c *ecs.Credential) {
			c.STS.Headers.Set(awsid.AudienceHeader, "other.example.com")
		}, want: identity.ReasonSTSUnbound},
		{name: "a signed header swapped after signing (another session token)", edit: func(_ *testing.T, c *ecs.Credential) {
			c.STS.Headers.Set("X-Amz-Security-Token", f.sts.IssueRole("aws", "123456789012", "ratings-task", f.task.TaskID, time.Hour).SessionToken)
		}, want: identity.ReasonSTSRejected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.api.Put(f.task) // undo a setup
			if tt.setup != nil {
				tt.setup()
			}
			cred := f.credential(t)
			if tt.edit != nil {
				tt.edit(t, &cred)
			}
			// A fresh checker: no description cached from another case.
			_, err := f.verifier(t, true).Verify(t.Context(), cred)
			if got := identity.ReasonOf(err); got != tt.want {
				t.Fatalf("Verify() = %v, want reason %s", err, tt.want)
			}
			if !tt.check {
				return
			}
			// What only the ECS API refuses is accepted, unconfirmed,
			// without it: the identity then proves no address.
			again := f.credential(t)
			if tt.edit != nil {
				tt.edit(t, &again)
			}
			id, err := f.verifier(t, false).Verify(t.Context(), again)
			if err != nil || id.ECS.TaskConfirmed || id.ECS.Address != "" {
				t.Errorf("without the ECS API check: Verify() = %+v, %v; want an unconfirmed identity without address", id, err)
			}
		})
	}
}

func TestReplayAndStaleness(t *testing.T) {
	f := newFixture(t)
	v := f.verifier(t, false)
	cred := f.credential(t)
	if _, err := v.Verify(t.Context(), cred); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(t.Context(), cred); identity.ReasonOf(err) != identity.ReasonSTSReplayed {
		t.Fatalf("the same signed request again: Verify() = %v, want %s", err, identity.ReasonSTSReplayed)
	}
	later := f.verifier(t, false, awsid.WithClock(func() time.Time { return time.Now().Add(10 * time.Minute) }))
	if _, err := later.Verify(t.Context(), f.credential(t)); identity.ReasonOf(err) != identity.ReasonSTSStale {
		t.Fatalf("a request signed 10 minutes ago: Verify() = %v, want %s", err, identity.ReasonSTSStale)
	}
}

// The check is cached per task and rate limited; a check it cannot make
// is TaskCheckUnavailable, not a refusal of the task.
func TestCheckerCacheAndLimits(t *testing.T) {
	f := newFixture(t)
	now := time.Now()
	c := f.checker(t, ecs.CheckerOptions{Options: apicheck.Options{Rate: 0.001, Burst: 3, CacheTTL: time.Minute, Clock: func() time.Time { return now }}})
	for range 3 {
		task, err := c.Describe(t.Context(), "123456789012", "us-east-2", "prod", f.task.ARN())
		if err != nil || task.RoleName != "ratings-task" || task.Address != "10.0.3.17" || task.Family != "ratings" || task.Revision != "3" {
			t.Fatalf("Describe() = %+v, %v", task, err)
		}
	}
	if n, m := f.api.Calls("DescribeTasks"), f.api.Calls("DescribeTaskDefinition"); n != 1 || m != 1 {
		t.Errorf("ECS calls: DescribeTasks %d, DescribeTaskDefinition %d; want 1 each (cached)", n, m)
	}
	other := f.api.Put(awstest.Task{Role: "ratings-task"})
	if _, err := c.Describe(t.Context(), "123456789012", "us-east-2", "prod", other.ARN()); err != nil {
		t.Fatalf("a second task (its task definition cached): %v", err)
	}
	third := f.api.Put(awstest.Task{Role: "ratings-task"})
	if _, err := c.Describe(t.Context(), "123456789012", "us-east-2", "prod", third.ARN()); !errors.Is(err, ecs.ErrRateLimited) {
		t.Fatalf("over the rate: Describe() = %v, want ErrRateLimited", err)
	}

	sv, err := awsid.NewVerifier(audience, awsid.WithSTSEndpoint(f.sts.URL))
	if err != nil {
		t.Fatal(err)
	}
	down := awstest.NewECS()
	down.Close()
	clients, err := ecs.NewClients(t.Context(), ecs.ClientOptions{ECSEndpoint: down.URL,
		Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")})
	if err != nil {
		t.Fatal(err)
	}
	dc, err := ecs.NewChecker(ecs.CheckerOptions{Clients: clients, Options: apicheck.Options{Timeout: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := ecs.NewVerifier(sv, dc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(t.Context(), f.credential(t)); identity.ReasonOf(err) != identity.ReasonTaskCheckUnavailable {
		t.Fatalf("ECS unreachable: Verify() = %v, want %s", err, identity.ReasonTaskCheckUnavailable)
	}
}

// The credentials endpoint refuses a request without the task's
// authorization token, as ECS's does: the SDK provider must send it.
func TestCredentialsEndpointNeedsToken(t *testing.T) {
	f := newFixture(t)
	p := endpointcreds.New(f.meta.CredentialsURI)
	if _, err := p.Retrieve(t.Context()); err == nil {
		t.Fatal("credentials served without the authorization token")
	}
	resp, err := http.Get(f.meta.MetadataURI + "/task")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := awswire.ParseTaskMetadata(body); err != nil {
		t.Fatalf("the fake's task metadata: %v", err)
	}
}

// The gate sees the task as claimed (confirmed, with its address) after
// STS and before ECS: a gate that refuses costs no ECS call.
func TestGateBeforeTheECSAPI(t *testing.T) {
	f := newFixture(t)
	refused := errors.New("no policy admits it")
	var seen *identity.ECSIdentity
	_, err := f.verifier(t, true).VerifyGated(t.Context(), f.credential(t), func(_ context.Context, claimed *identity.Identity) error {
		seen = claimed.ECS
		return refused
	})
	if !errors.Is(err, refused) {
		t.Fatalf("VerifyGated() = %v, want the gate's error", err)
	}
	if seen == nil || !seen.TaskConfirmed || seen.Address != "10.0.3.17" || seen.TaskRole != "ratings-task" {
		t.Errorf("the gate saw %+v, want the claimed task as if confirmed", seen)
	}
	if n := f.api.Calls("DescribeTasks"); n != 0 {
		t.Errorf("a refused gate cost %d DescribeTasks calls", n)
	}
	id, err := f.verifier(t, true).VerifyGated(t.Context(), f.credential(t), func(context.Context, *identity.Identity) error { return nil })
	if err != nil || !id.ECS.TaskConfirmed || f.api.Calls("DescribeTasks") != 1 {
		t.Fatalf("an admitting gate: %+v, %v, %d calls", id, err, f.api.Calls("DescribeTasks"))
	}
}

// A task launched with overrides.taskRoleArn gets sessions of the
// override's role, not its task definition's: the check takes the override.
func TestTaskRoleOverride(t *testing.T) {
	f := newFixture(t)
	task := f.api.Put(awstest.Task{Role: "ratings-task", RoleOverride: "ratings-canary"})
	meta := awstest.NewTaskMetadata(task, f.sts, "")
	t.Cleanup(meta.Close)
	cred := ecs.Credential{Cluster: "prod", TaskARN: task.ARN(), Family: "ratings", Revision: "3", AvailabilityZone: task.Zone, Address: task.Address,
		STS: sign(t, endpointcreds.New(meta.CredentialsURI), f.sts.URL, audience)}
	id, err := f.verifier(t, true).Verify(t.Context(), cred)
	if err != nil || id.ECS.TaskRole != "ratings-canary" || !id.ECS.TaskConfirmed {
		t.Fatalf("the override's session: %+v, %v", id, err)
	}
	if n := f.api.Calls("DescribeTaskDefinition"); n != 0 {
		t.Errorf("%d DescribeTaskDefinition calls for a task whose role is overridden, want 0", n)
	}
	cred.STS = sign(t, static(f.sts.IssueRole("aws", task.Account, "ratings-task", task.TaskID, time.Hour)), f.sts.URL, audience)
	if _, err := f.verifier(t, true).Verify(t.Context(), cred); identity.ReasonOf(err) != identity.ReasonTaskMismatch {
		t.Fatalf("a session of the task definition's role, overridden at launch: Verify() = %v, want %s", err, identity.ReasonTaskMismatch)
	}
}
