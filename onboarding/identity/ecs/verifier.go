package ecs

import (
	"context"
	"errors"
	"strings"

	"github.com/embark-mesh/embark/onboarding/identity"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

// Credential is the wire type [awswire.ECSCredential]: what an ECS task
// presents.
type Credential = awswire.ECSCredential

// CallerVerifier proves who signed an sts:GetCallerIdentity request
// (*awsidentity.Verifier).
type CallerVerifier interface {
	VerifyCaller(ctx context.Context, req *awsidentity.STSRequest, region string) (*awsidentity.Caller, error)
}

var (
	_ CallerVerifier                = (*awsidentity.Verifier)(nil)
	_ identity.Verifier[Credential] = (*Verifier)(nil)
	_ TaskChecker                   = (*Checker)(nil)
)

// TaskChecker asks the ECS API about a task (*Checker).
type TaskChecker interface {
	Describe(ctx context.Context, account, region, cluster, taskARN string) (*Task, error)
}

// Verifier verifies ECS task credentials. It is safe for concurrent use.
type Verifier struct {
	sts   CallerVerifier
	tasks TaskChecker
}

// NewVerifier returns a Verifier whose STS proofs sts checks. tasks, when
// not nil, confirms every task with the ECS API.
func NewVerifier(sts CallerVerifier, tasks TaskChecker) (*Verifier, error) {
	if sts == nil {
		return nil, errors.New("ecs identity verifier: an STS verifier is required")
	}
	return &Verifier{sts: sts, tasks: tasks}, nil
}

// Gate decides, before the ECS API is asked, whether a task could be
// admitted if the ECS API confirmed what it claims: claimed is the identity
// STS proved with the claims as if confirmed. An error stops the
// verification and is returned as it is.
type Gate func(ctx context.Context, claimed *identity.Identity) error

// Verify verifies cred and returns the task's identity.
func (v *Verifier) Verify(ctx context.Context, cred Credential) (*identity.Identity, error) {
	return v.VerifyGated(ctx, cred, nil)
}

// VerifyGated is Verify, with gate (when not nil) asked after STS proved the
// caller and before the ECS API is asked: an identity no policy could admit
// costs no ECS call (the calls are rate limited for every caller).
func (v *Verifier) VerifyGated(ctx context.Context, cred Credential, gate Gate) (*identity.Identity, error) {
	if cred.STS == nil {
		return nil, identity.Refuse(identity.ReasonMalformed, "ECS credential carries no signed sts:GetCallerIdentity request")
	}
	task, err := awswire.ParseTaskARN(cred.TaskARN)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "ECS credential's task ARN")
	}
	if err := checkClaims(cred, task); err != nil {
		return nil, err
	}
	caller, err := v.sts.VerifyCaller(ctx, cred.STS, task.Region)
	if err != nil {
		return nil, err
	}
	if err := matchCaller(caller, task); err != nil {
		return nil, err
	}
	id := &identity.ECSIdentity{
		Partition: caller.Partition, Account: caller.Account, Region: task.Region, Zone: cred.AvailabilityZone,
		Cluster: task.Cluster, TaskARN: cred.TaskARN, TaskID: task.TaskID, TaskRole: caller.RoleName,
		CallerARN: caller.ARN, Family: cred.Family, Revision: cred.Revision,
	}
	if v.tasks != nil {
		if gate != nil {
			claimed := *id
			claimed.Address, claimed.TaskConfirmed = cred.Address, true
			if err := gate(ctx, &identity.Identity{Method: identity.MethodECSTaskRole, ECS: &claimed}); err != nil {
				return nil, err
			}
		}
		if err := v.confirm(ctx, cred, id); err != nil {
			return nil, err
		}
	}
	return &identity.Identity{Method: identity.MethodECSTaskRole, ECS: id}, nil
}

// checkClaims checks that the claimed cluster and zone agree with the task
// ARN.
func checkClaims(cred Credential, task *awswire.TaskARN) error {
	if got := awswire.ClusterName(cred.Cluster); got != task.Cluster {
		return identity.Refuse(identity.ReasonTaskMismatch, "claimed cluster %q is not the cluster %s of task %s", clip(cred.Cluster), task.Cluster, cred.TaskARN)
	}
	zone := cred.AvailabilityZone
	if len(zone) <= len(task.Region) || !strings.HasPrefix(zone, task.Region) || len(zone) > 48 {
		return identity.Refuse(identity.ReasonMalformed, "claimed availability zone %q is not a zone of region %s", clip(zone), task.Region)
	}
	if len(cred.Family) > 255 || len(cred.Revision) > 16 {
		return identity.Refuse(identity.ReasonMalformed, "claimed task definition family or revision is too long")
	}
	return nil
}

// matchCaller requires the STS caller to be the task's role session: same
// partition and account, session named after the task ID.
func matchCaller(caller *awsidentity.Caller, task *awswire.TaskARN) error {
	switch {
	case caller.Partition != task.Partition:
		return identity.Refuse(identity.ReasonPartitionMismatch, "STS caller %s is in partition %s, task %s/%s is in %s", caller.ARN, caller.Partition, task.Cluster, task.TaskID, task.Partition)
	case caller.Account != task.Account:
		return identity.Refuse(identity.ReasonAccountMismatch, "STS caller %s is in account %s, the task is of account %s", caller.ARN, caller.Account, task.Account)
	case caller.SessionName != task.TaskID:
		return identity.Refuse(identity.ReasonTaskMismatch, "STS caller %s is a session named %q, not the session ECS creates for task %s", caller.ARN, caller.SessionName, task.TaskID)
	}
	return nil
}

// confirm asks the ECS API about the task and fills in what it confirms.
func (v *Verifier) confirm(ctx context.Context, cred Credential, id *identity.ECSIdentity) error {
	t, err := v.tasks.Describe(ctx, id.Account, id.Region, id.Cluster, id.TaskARN)
	switch {
	case errors.Is(err, ErrTaskNotFound):
		return identity.RefuseWrap(identity.ReasonTaskNotRunning, err, "ECS does not know task %s in cluster %s", id.TaskARN, id.Cluster)
	case err != nil:
		return identity.RefuseWrap(identity.ReasonTaskCheckUnavailable, err, "ask ECS about task %s", id.TaskARN)
	}
	if t.LastStatus != "RUNNING" || t.DesiredStatus != "RUNNING" {
		return identity.Refuse(identity.ReasonTaskNotRunning, "ECS reports task %s %s (desired %s), not RUNNING", id.TaskARN, t.LastStatus, t.DesiredStatus)
	}
	mismatch := func(what, got, want string) error {
		return identity.Refuse(identity.ReasonTaskMismatch, "ECS reports task %s with %s %q, the agent claimed (or STS proved) %q", id.TaskARN, what, clip(got), clip(want))
	}
	switch {
	case t.ARN != id.TaskARN:
		return mismatch("ARN", t.ARN, id.TaskARN)
	case awswire.ClusterName(t.ClusterARN) != id.Cluster:
		return mismatch("cluster", t.ClusterARN, id.Cluster)
	case t.RoleAccount != id.Account || t.RoleName != id.TaskRole:
		return mismatch("task role", t.RoleARN, id.CallerARN)
	case t.Zone != id.Zone:
		return mismatch("availability zone", t.Zone, id.Zone)
	case t.Address != cred.Address:
		return mismatch("ENI private address", t.Address, cred.Address)
	case cred.Family != "" && (t.Family != cred.Family || t.Revision != cred.Revision):
		return mismatch("task definition", t.Family+":"+t.Revision, cred.Family+":"+cred.Revision)
	}
	id.Family, id.Revision, id.Address, id.TaskConfirmed = t.Family, t.Revision, t.Address, true
	return nil
}

func clip(s string) string {
	if len(s) <= 200 {
		return s
	}
	return s[:200] + "..."
}
