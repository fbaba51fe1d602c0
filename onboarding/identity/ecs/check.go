package ecs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/arn"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/ecs"
	ecstypes "github.com/aws/aws-sdk-go-v2/service/ecs/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

// API is the part of the ECS client the check calls.
type API interface {
	DescribeTasks(ctx context.Context, in *ecs.DescribeTasksInput, opts ...func(*ecs.Options)) (*ecs.DescribeTasksOutput, error)
	DescribeTaskDefinition(ctx context.Context, in *ecs.DescribeTaskDefinitionInput, opts ...func(*ecs.Options)) (*ecs.DescribeTaskDefinitionOutput, error)
}

var _ API = (*ecs.Client)(nil)

// Clients returns the ECS client of an account's region.
type Clients func(ctx context.Context, account, region string) (API, error)

// Errors of Describe. ErrTaskNotFound is a refusal; the others say the
// check could not be made now.
var (
	ErrTaskNotFound = errors.New("ECS does not know the task")
	ErrRateLimited  = errors.New("ECS task checks over their rate limit")
	ErrUnavailable  = errors.New("ECS could not be asked")
)

// Task is what the ECS API reports of a task.
type Task struct {
	ARN, ClusterARN           string
	LastStatus, DesiredStatus string
	Zone                      string
	// Address is the private IPv4 address of the task's attached ENI.
	Address string
	// Family and Revision of the task definition.
	Family, Revision string
	// RoleARN is the task role (the override's, else the task
	// definition's); RoleAccount and RoleName are parsed from it.
	RoleARN, RoleAccount, RoleName string
}

// CheckerOptions configures a Checker. Every field documents its default.
type CheckerOptions struct {
	// Clients makes the ECS clients. Required.
	Clients Clients
	// Options bound the ECS calls and say how long a task's description is
	// reused (a task stopped since is seen after at most CacheTTL, default
	// 30s); task definitions never change and are cached for 10 times as
	// long.
	apicheck.Options
}

// Checker describes tasks with the ECS API, rate limited and cached.
type Checker struct {
	opts  CheckerOptions
	calls *apicheck.Calls
	tasks *apicheck.Cache[string, Task]   // by task ARN
	defs  *apicheck.Cache[string, string] // task definition ARN -> role ARN
}

// NewChecker returns a Checker.
func NewChecker(opts CheckerOptions) (*Checker, error) {
	if opts.Clients == nil {
		return nil, errors.New("ecs task check: Clients is required")
	}
	opts.SetDefaults(apicheck.DefaultCacheTTL)
	calls := opts.Calls(ErrRateLimited)
	return &Checker{opts: opts, calls: calls,
		tasks: apicheck.NewCache[string, Task](0, opts.Clock), defs: apicheck.NewCache[string, string](0, opts.Clock)}, nil
}

// Describe returns what ECS reports of the task taskARN in cluster (a
// name) of account's region.
func (c *Checker) Describe(ctx context.Context, account, region, cluster, taskARN string) (*Task, error) {
	if t, ok := c.tasks.Get(taskARN); ok {
		return &t, nil
	}
	api, err := c.opts.Clients(ctx, account, region)
	if err != nil {
		return nil, fmt.Errorf("%w: ECS client of %s/%s: %w", ErrUnavailable, account, region, err)
	}
	t, err := c.describeTask(ctx, api, cluster, taskARN)
	if err != nil {
		return nil, err
	}
	if t.RoleARN == "" {
		if t.RoleARN, err = c.definitionRole(ctx, api, t.definitionARN); err != nil {
			return nil, err
		}
	}
	if a, err := arn.Parse(t.RoleARN); err == nil && a.Service == "iam" && strings.HasPrefix(a.Resource, "role/") {
		t.RoleAccount, t.RoleName = a.AccountID, a.Resource[strings.LastIndex(a.Resource, "/")+1:]
	}
	c.tasks.Put(taskARN, t.Task, c.opts.CacheTTL)
	return &t.Task, nil
}

type describedTask struct {
	Task
	definitionARN string
}

func (c *Checker) describeTask(ctx context.Context, api API, cluster, taskARN string) (*describedTask, error) {
	ctx, cancel, err := c.calls.Start(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	out, err := api.DescribeTasks(ctx, &ecs.DescribeTasksInput{Cluster: aws.String(cluster), Tasks: []string{taskARN}})
	if err != nil {
		return nil, fmt.Errorf("%w: ecs:DescribeTasks %s: %w", ErrUnavailable, taskARN, err)
	}
	var found *ecstypes.Task
	for i := range out.Tasks {
		if aws.ToString(out.Tasks[i].TaskArn) == taskARN {
			found = &out.Tasks[i]
		}
	}
	if found == nil {
		reason := "no task answered"
		if len(out.Failures) > 0 {
			reason = aws.ToString(out.Failures[0].Reason)
		}
		return nil, fmt.Errorf("%w: %s in cluster %s: %s", ErrTaskNotFound, taskARN, cluster, reason)
	}
	t := &describedTask{Task: Task{
		ARN: taskARN, ClusterARN: aws.ToString(found.ClusterArn),
		LastStatus: aws.ToString(found.LastStatus), DesiredStatus: aws.ToString(found.DesiredStatus),
		Zone: aws.ToString(found.AvailabilityZone), Address: eniAddress(found.Attachments),
	}, definitionARN: aws.ToString(found.TaskDefinitionArn)}
	t.Family, t.Revision = familyRevision(t.definitionARN)
	if found.Overrides != nil {
		t.RoleARN = aws.ToString(found.Overrides.TaskRoleArn)
	}
	return t, nil
}

// definitionRole returns the task role of a task definition ("" when it
// has none).
func (c *Checker) definitionRole(ctx context.Context, api API, def string) (string, error) {
	if v, ok := c.defs.Get(def); ok {
		return v, nil
	}
	ctx, cancel, err := c.calls.Start(ctx)
	if err != nil {
		return "", err
	}
	defer cancel()
	out, err := api.DescribeTaskDefinition(ctx, &ecs.DescribeTaskDefinitionInput{TaskDefinition: aws.String(def)})
	if err != nil {
		return "", fmt.Errorf("%w: ecs:DescribeTaskDefinition %s: %w", ErrUnavailable, def, err)
	}
	if out.TaskDefinition == nil || aws.ToString(out.TaskDefinition.TaskDefinitionArn) != def {
		return "", fmt.Errorf("%w: ecs:DescribeTaskDefinition %s answered another task definition", ErrUnavailable, def)
	}
	role := aws.ToString(out.TaskDefinition.TaskRoleArn)
	c.defs.Put(def, role, 10*c.opts.CacheTTL)
	return role, nil
}

// eniAddress is the private IPv4 address of the task's attached ENI.
func eniAddress(atts []ecstypes.Attachment) string {
	for _, a := range atts {
		if aws.ToString(a.Type) != "ElasticNetworkInterface" || aws.ToString(a.Status) != "ATTACHED" {
			continue
		}
		for _, d := range a.Details {
			if aws.ToString(d.Name) == "privateIPv4Address" {
				return aws.ToString(d.Value)
			}
		}
	}
	return ""
}

// familyRevision splits arn:...:task-definition/<family>:<revision>.
func familyRevision(def string) (family, revision string) {
	_, res, ok := strings.Cut(def, ":task-definition/")
	if !ok {
		return "", ""
	}
	family, revision, ok = strings.Cut(res, ":")
	if _, err := strconv.Atoi(revision); !ok || err != nil {
		return "", ""
	}
	return family, revision
}

// ClientOptions configures NewClients.
type ClientOptions struct {
	// RoleARN, when set, is the role assumed in each task's account to ask
	// ECS ("{account}" and "{partition}" are replaced); it needs only
	// ecs:DescribeTasks and ecs:DescribeTaskDefinition. Empty: the
	// endpoint's own credentials are used (tasks of its own account only).
	RoleARN string
	// ECSEndpoint and STSEndpoint replace the AWS endpoints (tests, private
	// endpoints). Empty: the SDK's regional endpoints.
	ECSEndpoint, STSEndpoint string
	// Credentials are the endpoint's own AWS credentials. Default: the
	// SDK's default chain.
	Credentials aws.CredentialsProvider
}

// NewClients returns Clients with the endpoint's AWS credentials from the
// SDK's default chain, one client per account and region, made once.
func NewClients(ctx context.Context, opts ClientOptions) (Clients, error) {
	var loadOpts []func(*config.LoadOptions) error
	if opts.Credentials != nil {
		loadOpts = append(loadOpts, config.WithCredentialsProvider(opts.Credentials))
	}
	base, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	var mu sync.Mutex
	made := map[string]API{}
	return func(_ context.Context, account, region string) (API, error) {
		mu.Lock()
		defer mu.Unlock()
		key := account + "/" + region
		if c, ok := made[key]; ok {
			return c, nil
		}
		cfg := base.Copy()
		cfg.Region = region
		if opts.RoleARN != "" {
			role := strings.NewReplacer("{account}", account, "{partition}", awswire.PartitionForRegion(region)).Replace(opts.RoleARN)
			stsc := sts.NewFromConfig(cfg, func(o *sts.Options) {
				if opts.STSEndpoint != "" {
					o.BaseEndpoint = aws.String(opts.STSEndpoint)
				}
			})
			cfg.Credentials = aws.NewCredentialsCache(stscreds.NewAssumeRoleProvider(stsc, role, func(o *stscreds.AssumeRoleOptions) {
				o.RoleSessionName = "embark-ecs-task-check"
			}))
		}
		c := ecs.NewFromConfig(cfg, func(o *ecs.Options) {
			if opts.ECSEndpoint != "" {
				o.BaseEndpoint = aws.String(opts.ECSEndpoint)
			}
		})
		made[key] = c
		return c, nil
	}, nil
}
