package platform

import (
	"bytes"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	"github.com/embark-mesh/embark/onboarding/identity/ecs"
)

// ecsTask starts the task metadata and credentials endpoints of a task
// (role ratings-task) and sets the environment ECS gives its containers:
// the credentials at a full URI with an authorization token (the relative
// URI's 169.254.170.2 cannot be served by a test).
func ecsTask(t *testing.T) (*awstest.TaskMetadata, *awstest.STS) {
	t.Helper()
	sts := awstest.NewSTS()
	t.Cleanup(sts.Close)
	md := awstest.NewTaskMetadata(awstest.Task{Role: "ratings-task"}, sts, "task-auth-token")
	t.Cleanup(md.Close)
	t.Setenv(EnvECSMetadataURIV4, md.MetadataURI)
	t.Setenv(EnvContainerCredentialsRel, "")
	t.Setenv(EnvContainerCredentialsFull, md.CredentialsURI)
	t.Setenv(EnvContainerAuthToken, md.AuthorizationToken)
	return md, sts
}

func TestDetectECSAndCredential(t *testing.T) {
	md, sts := ecsTask(t)
	var logs bytes.Buffer
	cfg := config.Host{Platform: config.PlatformAuto, AWS: config.AWSPlatform{STSEndpoint: sts.URL}}
	p, err := Detect(t.Context(), cfg, "onboarding.example", testLogger(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "ecs" || !strings.Contains(logs.String(), "ecs detected") {
		t.Fatalf("detected %s, logs %s", p.Name(), logs.String())
	}
	cred, err := p.Credential(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	task := md.Task()
	if e := cred.ECS; e.GetTaskArn() != task.ARN() || e.GetCluster() != task.ClusterARN() || e.GetAvailabilityZone() != "us-east-2b" ||
		e.GetFamily() != "ratings" || e.GetRevision() != "3" || e.GetAddress() != "10.0.3.17" {
		t.Fatalf("credential %v", e)
	}
	if cred.Address == nil || cred.Address.IP != "10.0.3.17" || cred.Address.Type != "VPC" {
		t.Fatalf("address %+v", cred.Address)
	}
	// The signed request is the endpoint's to verify: the task role
	// session named after the task, bound to the audience.
	sv, err := awsid.NewVerifier("onboarding.example", awsid.WithSTSEndpoint(sts.URL))
	if err != nil {
		t.Fatal(err)
	}
	v, err := ecs.NewVerifier(sv, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := v.Verify(t.Context(), awswire.ECSFromProto(cred.ECS))
	if err != nil {
		t.Fatalf("the agent's credential does not verify: %v", err)
	}
	if id.ECS.TaskRole != "ratings-task" || id.ECS.TaskID != task.TaskID || id.ECS.Cluster != "prod" {
		t.Errorf("identity %+v", id.ECS)
	}
}

func TestECSWithoutTaskRole(t *testing.T) {
	ecsTask(t)
	t.Setenv(EnvContainerCredentialsFull, "")
	_, err := Detect(t.Context(), config.Host{Platform: config.PlatformECS}, "aud", testLogger(&bytes.Buffer{}))
	if err == nil || !strings.Contains(err.Error(), "the task has no task role") {
		t.Fatalf("Detect() = %v, want the missing task role named", err)
	}
}

func TestConfiguredECSOutsideATask(t *testing.T) {
	t.Setenv(EnvECSMetadataURIV4, "")
	_, err := Detect(t.Context(), config.Host{Platform: config.PlatformECS}, "aud", testLogger(&bytes.Buffer{}))
	if err == nil || !strings.Contains(err.Error(), EnvECSMetadataURIV4) {
		t.Fatalf("Detect() = %v, want %s named", err, EnvECSMetadataURIV4)
	}
}
