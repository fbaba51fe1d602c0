package profile

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

// ClientOptions configures NewClients.
type ClientOptions struct {
	// RoleARN, when set, is the role assumed in each instance's account to
	// ask EC2 and IAM ("{account}" and "{partition}" are replaced), e.g.
	// arn:{partition}:iam::{account}:role/embark-instance-profile-reader;
	// it needs only ec2:DescribeIamInstanceProfileAssociations and
	// iam:GetInstanceProfile. Empty: the endpoint's own credentials are
	// used as they are (instances in its own account only).
	RoleARN string
	// EC2Endpoint, IAMEndpoint and STSEndpoint replace the AWS endpoints
	// (tests; private endpoints). Empty: the SDK's regional endpoints.
	EC2Endpoint, IAMEndpoint, STSEndpoint string
	// HTTPClient. Default: the SDK's.
	HTTPClient *http.Client
	// Credentials are the endpoint's own AWS credentials. Default: the
	// SDK's default chain.
	Credentials aws.CredentialsProvider
}

// NewClients returns Clients with the endpoint's AWS credentials from the
// SDK's default chain (environment, web identity / IRSA, EKS Pod Identity,
// shared files, instance role), one client per account and region, made
// once.
func NewClients(ctx context.Context, opts ClientOptions) (Clients, error) {
	var loadOpts []func(*config.LoadOptions) error
	if opts.HTTPClient != nil {
		loadOpts = append(loadOpts, config.WithHTTPClient(opts.HTTPClient))
	}
	if opts.Credentials != nil {
		loadOpts = append(loadOpts, config.WithCredentialsProvider(opts.Credentials))
	}
	base, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	type pair struct {
		ec2 EC2API
		iam IAMAPI
	}
	var mu sync.Mutex
	made := map[string]pair{}
	return func(_ context.Context, account, region string) (EC2API, IAMAPI, error) {
		mu.Lock()
		defer mu.Unlock()
		key := account + "/" + region
		if p, ok := made[key]; ok {
			return p.ec2, p.iam, nil
		}
		cfg := base.Copy()
		cfg.Region = region
		if opts.RoleARN != "" {
			arn := strings.NewReplacer("{account}", account, "{partition}", awswire.PartitionForRegion(region)).Replace(opts.RoleARN)
			stsc := sts.NewFromConfig(cfg, func(o *sts.Options) {
				if opts.STSEndpoint != "" {
					o.BaseEndpoint = aws.String(opts.STSEndpoint)
				}
			})
			cfg.Credentials = aws.NewCredentialsCache(stscreds.NewAssumeRoleProvider(stsc, arn, func(o *stscreds.AssumeRoleOptions) {
				o.RoleSessionName = "embark-instance-profile-check"
			}))
		}
		p := pair{
			ec2: ec2.NewFromConfig(cfg, func(o *ec2.Options) {
				if opts.EC2Endpoint != "" {
					o.BaseEndpoint = aws.String(opts.EC2Endpoint)
				}
			}),
			iam: iam.NewFromConfig(cfg, func(o *iam.Options) {
				if opts.IAMEndpoint != "" {
					o.BaseEndpoint = aws.String(opts.IAMEndpoint)
				}
			}),
		}
		made[key] = p
		return p.ec2, p.iam, nil
	}, nil
}
