// Package client is the agent's side of EC2 identity: it reads the instance
// identity document and its rsa2048 signature from IMDS, and produces a
// signed sts:GetCallerIdentity request with the instance's role credentials,
// bound to one onboarding endpoint by the signed
// X-Embark-Onboarding-Audience header. Both go through aws-sdk-go-v2
// (feature/ec2/imds, credentials/ec2rolecreds, service/sts and its SigV4
// signer); the signed request is captured after signing and never sent by
// the agent: the onboarding endpoint sends it to STS.
package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

// IMDS paths under /latest/dynamic of the document and its signature.
const (
	DocumentPath  = "instance-identity/document"
	SignaturePath = "instance-identity/rsa2048"
)

const maxIMDSResponse = 64 << 10

// DynamicDataAPI is the part of *imds.Client this package uses.
type DynamicDataAPI interface {
	GetDynamicData(ctx context.Context, params *imds.GetDynamicDataInput, optFns ...func(*imds.Options)) (*imds.GetDynamicDataOutput, error)
}

// CallerIdentityAPI is the part of *sts.Client this package uses.
type CallerIdentityAPI interface {
	GetCallerIdentity(ctx context.Context, params *sts.GetCallerIdentityInput, optFns ...func(*sts.Options)) (*sts.GetCallerIdentityOutput, error)
}

var (
	_ DynamicDataAPI    = (*imds.Client)(nil)
	_ CallerIdentityAPI = (*sts.Client)(nil)
)

// FetchInstanceIdentity reads the instance identity document and its
// rsa2048 signature from IMDS, byte for byte as served.
func FetchInstanceIdentity(ctx context.Context, c DynamicDataAPI) (document, signature []byte, err error) {
	document, err = getDynamic(ctx, c, DocumentPath)
	if err != nil {
		return nil, nil, err
	}
	signature, err = getDynamic(ctx, c, SignaturePath)
	if err != nil {
		return nil, nil, err
	}
	return document, signature, nil
}

func getDynamic(ctx context.Context, c DynamicDataAPI, path string) ([]byte, error) {
	out, err := c.GetDynamicData(ctx, &imds.GetDynamicDataInput{Path: path})
	if err != nil {
		return nil, fmt.Errorf("read IMDS %s: %w", path, err)
	}
	defer func() { _ = out.Content.Close() }()
	data, err := io.ReadAll(io.LimitReader(out.Content, maxIMDSResponse+1))
	if err != nil {
		return nil, fmt.Errorf("read IMDS %s: %w", path, err)
	}
	if len(data) > maxIMDSResponse {
		return nil, fmt.Errorf("read IMDS %s: more than %d bytes", path, maxIMDSResponse)
	}
	return data, nil
}

// NewSTSClient returns an STS client for region whose credentials are the
// instance profile's role credentials read through imdsClient. optFns may
// set e.g. BaseEndpoint (a test fake, or a VPC endpoint the onboarding
// endpoint is configured with).
func NewSTSClient(imdsClient ec2rolecreds.GetMetadataAPIClient, region string, optFns ...func(*sts.Options)) *sts.Client {
	creds := ec2rolecreds.New(func(o *ec2rolecreds.Options) { o.Client = imdsClient })
	return sts.New(sts.Options{
		Region:      region,
		Credentials: sdkaws.NewCredentialsCache(creds),
	}, optFns...)
}

var errCaptured = errors.New("signed request captured, not sent")

// captureSigned is the last Finalize middleware: it sees the request after
// SigV4 signing, records it and stops the operation before it is sent.
type captureSigned struct {
	out *awswire.STSRequest
}

func (*captureSigned) ID() string { return "EmbarkCaptureSignedRequest" }

func (m *captureSigned) HandleFinalize(ctx context.Context, in middleware.FinalizeInput, _ middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
	req, ok := in.Request.(*smithyhttp.Request)
	if !ok {
		return middleware.FinalizeOutput{}, middleware.Metadata{}, fmt.Errorf("unexpected request type %T", in.Request)
	}
	if err := req.RewindStream(); err != nil {
		return middleware.FinalizeOutput{}, middleware.Metadata{}, fmt.Errorf("rewind signed request body: %w", err)
	}
	var body []byte
	if s := req.GetStream(); s != nil {
		b, err := io.ReadAll(s)
		if err != nil {
			return middleware.FinalizeOutput{}, middleware.Metadata{}, fmt.Errorf("read signed request body: %w", err)
		}
		body = b
	}
	u := *req.URL
	if req.Host != "" {
		u.Host = req.Host
	}
	header := req.Header.Clone()
	if header.Get("Content-Length") == "" && len(body) > 0 {
		header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	*m.out = awswire.STSRequest{Method: req.Method, URL: u.String(), Headers: header, Body: bytes.Clone(body)}
	return middleware.FinalizeOutput{}, middleware.Metadata{}, errCaptured
}

// SignGetCallerIdentity has c build and sign an sts:GetCallerIdentity
// request carrying AudienceHeader = audience among its signed headers, and
// returns it unsent. c's region, endpoint and credentials decide where the
// request is for and who it proves.
func SignGetCallerIdentity(ctx context.Context, c CallerIdentityAPI, audience string) (*awswire.STSRequest, error) {
	if audience == "" {
		return nil, errors.New("sign sts:GetCallerIdentity: audience must not be empty")
	}
	var captured awswire.STSRequest
	capture := &captureSigned{out: &captured}
	_, err := c.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}, func(o *sts.Options) {
		o.Retryer = sdkaws.NopRetryer{}
		o.APIOptions = append(o.APIOptions,
			smithyhttp.SetHeaderValue(awswire.AudienceHeader, audience),
			func(stack *middleware.Stack) error {
				return stack.Finalize.Add(capture, middleware.After)
			},
		)
	})
	if !errors.Is(err, errCaptured) {
		if err == nil {
			err = errors.New("the request was sent instead of captured")
		}
		return nil, fmt.Errorf("sign sts:GetCallerIdentity: %w", err)
	}
	if captured.Method != http.MethodPost || captured.Headers.Get("Authorization") == "" {
		return nil, fmt.Errorf("sign sts:GetCallerIdentity: captured request is not a signed POST (%s)", captured.Method)
	}
	return &captured, nil
}

// Credential gathers what an EC2 instance presents to the onboarding
// endpoint: the document and signature from imdsClient and, if stsClient is
// not nil, a signed sts:GetCallerIdentity request bound to audience.
func Credential(ctx context.Context, imdsClient DynamicDataAPI, stsClient CallerIdentityAPI, audience string) (*awswire.Credential, error) {
	doc, sig, err := FetchInstanceIdentity(ctx, imdsClient)
	if err != nil {
		return nil, err
	}
	cred := &awswire.Credential{Document: doc, Signature: sig}
	if stsClient != nil {
		req, err := SignGetCallerIdentity(ctx, stsClient, audience)
		if err != nil {
			return nil, err
		}
		cred.STS = req
	}
	return cred, nil
}
