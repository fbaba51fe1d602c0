package platform

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
)

// AWS is the EC2 platform: IMDSv2 through aws-sdk-go-v2's imds client.
type AWS struct {
	cfg      config.AWSPlatform
	audience string
	imds     *imds.Client
	log      *slog.Logger
}

// NewAWS returns the EC2 platform; audience binds its STS proof to the
// onboarding endpoint.
func NewAWS(cfg config.AWSPlatform, audience string, log *slog.Logger) *AWS {
	var opts imds.Options
	if cfg.IMDSEndpoint != "" {
		opts.Endpoint = cfg.IMDSEndpoint
	}
	return &AWS{cfg: cfg, audience: audience, imds: imds.New(opts), log: log}
}

// Name implements Platform.
func (*AWS) Name() string { return config.PlatformAWS }

// probe asks IMDSv2 for the instance's region.
func (a *AWS) probe(ctx context.Context) (string, error) {
	out, err := a.imds.GetRegion(ctx, &imds.GetRegionInput{})
	if err != nil {
		return "", err
	}
	return out.Region, nil
}

// Credential implements Platform: the document and its signature, plus a
// signed sts:GetCallerIdentity request when the instance has a role (and
// host.aws.disableSTSProof is not set).
func (a *AWS) Credential(ctx context.Context) (*Credential, error) {
	doc, sig, err := awsclient.FetchInstanceIdentity(ctx, a.imds)
	if err != nil {
		return nil, fmt.Errorf("aws: %w", err)
	}
	parsed, err := awswire.ParseDocument(doc)
	if err != nil {
		return nil, fmt.Errorf("aws: the instance identity document from IMDS: %w", err)
	}
	cred := &awswire.Credential{Document: doc, Signature: sig}
	if !a.cfg.DisableSTSProof {
		if _, err := readMetadata(ctx, a.imds, "iam/info"); err != nil {
			a.log.Debug("aws: the instance has no IAM role; sending no STS proof", "error", err.Error())
		} else {
			var optFns []func(*sts.Options)
			if a.cfg.STSEndpoint != "" {
				ep := a.cfg.STSEndpoint
				optFns = append(optFns, func(o *sts.Options) { o.BaseEndpoint = &ep })
			}
			sc := awsclient.NewSTSClient(a.imds, parsed.Region, optFns...)
			req, err := awsclient.SignGetCallerIdentity(ctx, sc, a.audience)
			if err != nil {
				return nil, fmt.Errorf("aws: %w", err)
			}
			cred.STS = req
		}
	}
	out := &Credential{AWS: awswire.ToProto(cred)}
	if parsed.PrivateIP != "" {
		out.Address = &Address{IP: parsed.PrivateIP, Type: "VPC"}
	}
	return out, nil
}
