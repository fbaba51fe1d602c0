package platform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials/endpointcreds"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
)

// Environment variables ECS sets in every container of a task.
const (
	EnvECSMetadataURIV4         = "ECS_CONTAINER_METADATA_URI_V4"
	EnvContainerCredentialsRel  = "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"
	EnvContainerCredentialsFull = "AWS_CONTAINER_CREDENTIALS_FULL_URI"
	EnvContainerAuthToken       = "AWS_CONTAINER_AUTHORIZATION_TOKEN"
	EnvContainerAuthTokenFile   = "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"
)

// ecsCredentialsHost is where ECS serves a task's role credentials at
// AWS_CONTAINER_CREDENTIALS_RELATIVE_URI.
const ecsCredentialsHost = "http://169.254.170.2"

// ECS is the ECS task platform: the agent runs as a container of the task,
// reads the task from the task metadata endpoint v4 and signs an
// sts:GetCallerIdentity request with the task role's credentials, read by
// the SDK's container credential provider (endpointcreds).
type ECS struct {
	metadataURI string
	stsEndpoint string
	audience    string
	creds       sdkaws.CredentialsProvider
	client      *http.Client
	log         *slog.Logger
}

// NewECS returns the ECS platform from the environment ECS gives the
// task's containers; audience binds the STS proof to the onboarding
// endpoint.
func NewECS(cfg config.AWSPlatform, audience string, log *slog.Logger) (*ECS, error) {
	uri := os.Getenv(EnvECSMetadataURIV4)
	if uri == "" {
		return nil, fmt.Errorf("ecs: %s is not set: not an ECS task container (or an ECS agent older than 1.39)", EnvECSMetadataURIV4)
	}
	creds, err := containerCredentials()
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // the task metadata endpoint is link-local: never through a proxy
	client := &http.Client{Timeout: 10 * time.Second, Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &ECS{metadataURI: strings.TrimSuffix(uri, "/"), stsEndpoint: cfg.STSEndpoint, audience: audience,
		creds: sdkaws.NewCredentialsCache(creds), client: client, log: log}, nil
}

// containerCredentials is the SDK's container credential provider for the
// endpoint ECS names in the environment, with its authorization token.
func containerCredentials() (sdkaws.CredentialsProvider, error) {
	uri := os.Getenv(EnvContainerCredentialsFull)
	if rel := os.Getenv(EnvContainerCredentialsRel); rel != "" {
		uri = ecsCredentialsHost + rel
	}
	if uri == "" {
		return nil, fmt.Errorf("ecs: neither %s nor %s is set: the task has no task role", EnvContainerCredentialsRel, EnvContainerCredentialsFull)
	}
	return endpointcreds.New(uri, func(o *endpointcreds.Options) {
		if tok := os.Getenv(EnvContainerAuthToken); tok != "" {
			o.AuthorizationToken = tok
		}
		if f := os.Getenv(EnvContainerAuthTokenFile); f != "" {
			o.AuthorizationTokenProvider = endpointcreds.TokenProviderFunc(func() (string, error) {
				b, err := os.ReadFile(f)
				return strings.TrimSpace(string(b)), err
			})
		}
	}), nil
}

// Name implements Platform.
func (*ECS) Name() string { return config.PlatformECS }

// Credential implements Platform: the task as the task metadata endpoint
// reports it, a signed sts:GetCallerIdentity request made with the task
// role's credentials for the task's region, and the task's ENI address.
func (e *ECS) Credential(ctx context.Context) (*Credential, error) {
	body, err := e.get(ctx, e.metadataURI+"/task")
	if err != nil {
		return nil, fmt.Errorf("ecs: task metadata: %w", err)
	}
	meta, err := awswire.ParseTaskMetadata(body)
	if err != nil {
		return nil, fmt.Errorf("ecs: %w", err)
	}
	task, _ := awswire.ParseTaskARN(meta.TaskARN) // checked by ParseTaskMetadata
	sc := sts.New(sts.Options{Region: task.Region, Credentials: e.creds}, func(o *sts.Options) {
		if e.stsEndpoint != "" {
			o.BaseEndpoint = sdkaws.String(e.stsEndpoint)
		}
	})
	req, err := awsclient.SignGetCallerIdentity(ctx, sc, e.audience)
	if err != nil {
		return nil, fmt.Errorf("ecs: %w", err)
	}
	cred := &awswire.ECSCredential{STS: req, Cluster: meta.Cluster, TaskARN: meta.TaskARN, Family: meta.Family,
		Revision: meta.Revision, AvailabilityZone: meta.AvailabilityZone, Address: meta.Address()}
	out := &Credential{ECS: awswire.ECSToProto(cred)}
	if cred.Address != "" {
		out.Address = &Address{IP: cred.Address, Type: "VPC"}
	}
	return out, nil
}

func (e *ECS) get(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, awswire.MaxTaskMetadataSize+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", u, resp.Status)
	}
	if len(body) == 0 {
		return nil, errors.New("empty answer")
	}
	return body, nil
}
