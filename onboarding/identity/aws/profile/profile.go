// Package profile confirms with EC2 and IAM that an EC2 instance's current
// instance profile carries the IAM role its STS proof showed.
//
// An STS proof (package aws) shows that the caller holds credentials of an
// assumed-role session named after the instance, in the instance's
// account; anyone allowed to sts:AssumeRole into that role can choose that
// session name. The check here closes that gap: EC2
// DescribeIamInstanceProfileAssociations names the instance profile
// associated with the instance now, and IAM GetInstanceProfile names the
// role in it; the proven role must be that role. Calls go through the real
// aws-sdk-go-v2 clients, are rate-limited (a token bucket shared by all
// callers: they cost the endpoint's AWS quota) and cached per instance and
// per profile for a short time.
package profile

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
)

// EC2API is the part of the EC2 client the check calls.
type EC2API interface {
	DescribeIamInstanceProfileAssociations(ctx context.Context, in *ec2.DescribeIamInstanceProfileAssociationsInput, opts ...func(*ec2.Options)) (*ec2.DescribeIamInstanceProfileAssociationsOutput, error)
}

// IAMAPI is the part of the IAM client the check calls.
type IAMAPI interface {
	GetInstanceProfile(ctx context.Context, in *iam.GetInstanceProfileInput, opts ...func(*iam.Options)) (*iam.GetInstanceProfileOutput, error)
}

// Clients returns the EC2 client of an account's region and the IAM client
// of the account (normally with credentials of a role assumed in that
// account; see NewClients).
type Clients func(ctx context.Context, account, region string) (EC2API, IAMAPI, error)

// Errors of Confirm. Refusals (the instance does not carry the role) are
// ErrNoProfile and ErrRoleNotInProfile; ErrRateLimited and ErrUnavailable
// say the check could not be made now (retry later).
var (
	ErrNoProfile        = errors.New("no instance profile is associated with the instance")
	ErrRoleNotInProfile = errors.New("the instance's instance profile does not carry the proven role")
	ErrRateLimited      = errors.New("instance profile checks over their rate limit")
	ErrUnavailable      = errors.New("EC2 or IAM could not be asked")
)

// DefaultCacheTTL is Options.CacheTTL's default, longer than other API
// checks' (apicheck.DefaultCacheTTL): an instance's profile seldom changes.
const DefaultCacheTTL = time.Minute

// Options configures a Checker. Every field documents its default.
type Options struct {
	// Clients makes the AWS clients. Required.
	Clients Clients
	// Options bound the EC2 and IAM calls and say how long an instance's
	// profile and a profile's roles are reused (a profile replaced on the
	// instance is seen after at most CacheTTL, default DefaultCacheTTL).
	apicheck.Options
}

// Checker confirms instance profiles.
type Checker struct {
	opts     Options
	calls    *apicheck.Calls
	profiles *apicheck.Cache[string, string] // "account/region/instance" -> profile ARN ("" = none)
	roles    *apicheck.Cache[string, string] // profile ARN -> role names, comma-joined
}

// New returns a Checker.
func New(opts Options) (*Checker, error) {
	if opts.Clients == nil {
		return nil, errors.New("profile: Clients is required")
	}
	opts.SetDefaults(DefaultCacheTTL)
	calls := opts.Calls(ErrRateLimited)
	return &Checker{opts: opts, calls: calls,
		profiles: apicheck.NewCache[string, string](0, opts.Clock), roles: apicheck.NewCache[string, string](0, opts.Clock)}, nil
}

// Confirm checks that instance (in account and region) has an instance
// profile associated now whose role is role. It returns nil, or an error
// wrapping one of the package's errors.
func (c *Checker) Confirm(ctx context.Context, account, region, instance, role string) error {
	profileARN, err := c.profileOf(ctx, account, region, instance)
	if err != nil {
		return err
	}
	if profileARN == "" {
		return fmt.Errorf("%w: %s in %s/%s", ErrNoProfile, instance, account, region)
	}
	roles, err := c.rolesOf(ctx, account, region, profileARN)
	if err != nil {
		return err
	}
	for _, r := range strings.Split(roles, ",") {
		if r != "" && r == role {
			return nil
		}
	}
	return fmt.Errorf("%w: instance %s has profile %s with role(s) [%s], the STS proof shows role %s", ErrRoleNotInProfile, instance, profileARN, roles, role)
}

// profileOf returns the ARN of the instance profile associated with the
// instance now ("" when none).
func (c *Checker) profileOf(ctx context.Context, account, region, instance string) (string, error) {
	key := account + "/" + region + "/" + instance
	if v, ok := c.profiles.Get(key); ok {
		return v, nil
	}
	ec2c, _, err := c.opts.Clients(ctx, account, region)
	if err != nil {
		return "", fmt.Errorf("%w: AWS clients of %s/%s: %w", ErrUnavailable, account, region, err)
	}
	ctx, cancel, err := c.calls.Start(ctx)
	if err != nil {
		return "", err
	}
	defer cancel()
	out, err := ec2c.DescribeIamInstanceProfileAssociations(ctx, &ec2.DescribeIamInstanceProfileAssociationsInput{
		Filters: []ec2types.Filter{
			{Name: aws.String("instance-id"), Values: []string{instance}},
			{Name: aws.String("state"), Values: []string{"associated"}},
		},
	})
	if err != nil {
		return "", fmt.Errorf("%w: ec2:DescribeIamInstanceProfileAssociations for %s: %w", ErrUnavailable, instance, err)
	}
	var arn string
	for _, a := range out.IamInstanceProfileAssociations {
		// The filter is EC2's; check what it answered all the same.
		if aws.ToString(a.InstanceId) != instance || a.State != ec2types.IamInstanceProfileAssociationStateAssociated || a.IamInstanceProfile == nil {
			continue
		}
		if arn != "" {
			return "", fmt.Errorf("%w: EC2 answered more than one associated instance profile for %s", ErrUnavailable, instance)
		}
		arn = aws.ToString(a.IamInstanceProfile.Arn)
	}
	if arn != "" {
		if acct, ok := accountOf(arn); !ok || acct != account {
			return "", fmt.Errorf("%w: instance profile %q is not an instance profile of account %s", ErrUnavailable, arn, account)
		}
	}
	c.profiles.Put(key, arn, c.opts.CacheTTL)
	return arn, nil
}

// rolesOf returns the role names of the instance profile, comma-joined.
func (c *Checker) rolesOf(ctx context.Context, account, region, profileARN string) (string, error) {
	if v, ok := c.roles.Get(profileARN); ok {
		return v, nil
	}
	_, iamc, err := c.opts.Clients(ctx, account, region)
	if err != nil {
		return "", fmt.Errorf("%w: AWS clients of %s: %w", ErrUnavailable, account, err)
	}
	name := profileARN[strings.LastIndex(profileARN, "/")+1:]
	ctx, cancel, err := c.calls.Start(ctx)
	if err != nil {
		return "", err
	}
	defer cancel()
	out, err := iamc.GetInstanceProfile(ctx, &iam.GetInstanceProfileInput{InstanceProfileName: aws.String(name)})
	if err != nil {
		return "", fmt.Errorf("%w: iam:GetInstanceProfile %s: %w", ErrUnavailable, name, err)
	}
	if out.InstanceProfile == nil || aws.ToString(out.InstanceProfile.Arn) != profileARN {
		return "", fmt.Errorf("%w: iam:GetInstanceProfile %s answered another profile", ErrUnavailable, name)
	}
	var roles []string
	for _, r := range out.InstanceProfile.Roles {
		roles = append(roles, aws.ToString(r.RoleName))
	}
	v := strings.Join(roles, ",")
	c.roles.Put(profileARN, v, c.opts.CacheTTL)
	return v, nil
}

// accountOf returns the account of an IAM ARN
// (arn:<partition>:iam::<account>:instance-profile/...).
func accountOf(arn string) (string, bool) {
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) != 6 || parts[0] != "arn" || parts[2] != "iam" || !strings.HasPrefix(parts[5], "instance-profile/") {
		return "", false
	}
	return parts[4], true
}
