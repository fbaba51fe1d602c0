// Package platform is how the onboarding agent proves what its host is: on
// AWS EC2 the instance identity document, its rsa2048 signature and a signed
// sts:GetCallerIdentity request, all through IMDSv2 with aws-sdk-go-v2's imds
// client; in an ECS task the task metadata endpoint v4 and an
// sts:GetCallerIdentity request signed with the task role; on Google Compute Engine the instance identity token of its
// metadata server; on premises a JWT read from a file or printed by a
// credential plugin command; on an Azure VM the access token of its
// system-assigned managed identity from the Instance Metadata Service.
// Detect picks the platform (AWS when IMDS answers, else GCE when the
// metadata server answers, else Azure when its IMDS answers) and says what
// it found.
package platform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// Address is one detected host address.
type Address struct {
	IP   string
	Type string // VPC or INTERNET
}

// Platform produces the host's platform credential.
type Platform interface {
	// Name says which platform (aws, gce, jwt).
	Name() string
	// Credential returns a fresh credential for an AuthorizeRequest; it is
	// called for every authorization (credentials are short-lived).
	Credential(ctx context.Context) (*Credential, error)
}

// Credential is a platform credential in its wire form, plus the host
// address the platform reports (empty when it reports none).
type Credential struct {
	AWS     *onboardingv1alpha1.AWSCredential
	JWT     *onboardingv1alpha1.JWTCredential
	GCE     *onboardingv1alpha1.GCECredential
	Azure   *onboardingv1alpha1.AzureCredential
	ECS     *onboardingv1alpha1.ECSCredential
	Address *Address
}

// SetOn puts the credential on req.
func (c *Credential) SetOn(req *onboardingv1alpha1.AuthorizeRequest) {
	switch {
	case c.AWS != nil:
		req.Credential = &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: c.AWS}
	case c.JWT != nil:
		req.Credential = &onboardingv1alpha1.AuthorizeRequest_Jwt{Jwt: c.JWT}
	case c.GCE != nil:
		req.Credential = &onboardingv1alpha1.AuthorizeRequest_Gce{Gce: c.GCE}
	case c.Azure != nil:
		req.Credential = &onboardingv1alpha1.AuthorizeRequest_Azure{Azure: c.Azure}
	case c.ECS != nil:
		req.Credential = &onboardingv1alpha1.AuthorizeRequest_Ecs{Ecs: c.ECS}
	}
}

// DetectTimeout bounds the IMDS probe of autodetection.
const DetectTimeout = 3 * time.Second

// Detect returns the platform cfg selects: aws, ecs, gce, azure or jwt
// when set, else ecs when ECS_CONTAINER_METADATA_URI_V4 is set, else AWS
// when IMDS answers within DetectTimeout, else GCE when the metadata server
// answers within DetectTimeout, else Azure when its Instance Metadata
// Service answers within DetectTimeout, else jwt when a JWT source is
// configured. audience binds the STS proof, the GCE token and (unless
// host.azure.resource is set) the Azure token to the onboarding endpoint. It
// logs what it detected and why.
func Detect(ctx context.Context, cfg config.Host, audience string, log *slog.Logger) (Platform, error) {
	switch cfg.Platform {
	case config.PlatformAWS:
		log.Info("platform: aws (configured)", "imds", imdsEndpointName(cfg.AWS))
		return NewAWS(cfg.AWS, audience, log), nil
	case config.PlatformGCE:
		g := NewGCE(cfg.GCE, audience, log)
		log.Info("platform: gce (configured)", "metadataServer", g.endpoint)
		return g, nil
	case config.PlatformAzure:
		a := NewAzure(cfg.Azure, audience, log)
		log.Info("platform: azure (configured)", "imds", a.endpoint, "resource", a.resource)
		return a, nil
	case config.PlatformECS:
		e, err := NewECS(cfg.AWS, audience, log)
		if err != nil {
			return nil, err
		}
		log.Info("platform: ecs (configured)", "taskMetadata", e.metadataURI)
		return e, nil
	case config.PlatformJWT:
		p, err := NewJWT(cfg.JWT)
		if err != nil {
			return nil, err
		}
		log.Info("platform: jwt (configured)", "source", p.source())
		return p, nil
	}
	if os.Getenv(EnvECSMetadataURIV4) != "" {
		e, err := NewECS(cfg.AWS, audience, log)
		if err != nil {
			return nil, err
		}
		log.Info("platform: ecs detected ("+EnvECSMetadataURIV4+" is set)", "taskMetadata", e.metadataURI)
		return e, nil
	}
	aws := NewAWS(cfg.AWS, audience, log)
	probeCtx, cancel := context.WithTimeout(ctx, DetectTimeout)
	defer cancel()
	region, err := aws.probe(probeCtx)
	if err == nil {
		log.Info("platform: aws EC2 detected (IMDSv2 answered)", "imds", imdsEndpointName(cfg.AWS), "region", region)
		return aws, nil
	}
	gce := NewGCE(cfg.GCE, audience, log)
	gceCtx, cancelGCE := context.WithTimeout(ctx, DetectTimeout)
	defer cancelGCE()
	zone, gerr := gce.probe(gceCtx)
	if gerr == nil {
		log.Info("platform: gce detected (the Compute Engine metadata server answered)", "metadataServer", gce.endpoint, "zone", zone)
		return gce, nil
	}
	az := NewAzure(cfg.Azure, audience, log)
	azCtx, cancelAz := context.WithTimeout(ctx, DetectTimeout)
	defer cancelAz()
	location, aerr := az.probe(azCtx)
	if aerr == nil {
		log.Info("platform: azure detected (the Instance Metadata Service answered)", "imds", az.endpoint, "location", location, "resource", az.resource)
		return az, nil
	}
	if cfg.JWT.TokenFile != "" || len(cfg.JWT.Command) > 0 {
		p, jerr := NewJWT(cfg.JWT)
		if jerr != nil {
			return nil, jerr
		}
		log.Info("platform: jwt (IMDS did not answer, a JWT source is configured)", "source", p.source(), "imdsError", err.Error())
		return p, nil
	}
	return nil, fmt.Errorf("no platform detected: AWS IMDS at %s did not answer (%w), the Compute Engine metadata server at %s did not answer (%w), the Azure Instance Metadata Service at %s did not answer (%w) and host.jwt names no tokenFile or command",
		imdsEndpointName(cfg.AWS), err, gce.endpoint, gerr, az.endpoint, aerr)
}

func imdsEndpointName(c config.AWSPlatform) string {
	if c.IMDSEndpoint != "" {
		return c.IMDSEndpoint
	}
	return "http://169.254.169.254"
}

// LocalAddress returns the address this host uses to reach addr (no packet
// is sent: a UDP socket is connected and its local address read).
func LocalAddress(addr string) (string, error) {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return "", fmt.Errorf("find the local address towards %s: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	ua, ok := conn.LocalAddr().(*net.UDPAddr)
	if !ok {
		return "", fmt.Errorf("find the local address towards %s: unexpected %T", addr, conn.LocalAddr())
	}
	return ua.IP.String(), nil
}

func readMetadata(ctx context.Context, c *imds.Client, path string) (string, error) {
	out, err := c.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err != nil {
		return "", err
	}
	defer func() { _ = out.Content.Close() }()
	b, err := io.ReadAll(io.LimitReader(out.Content, 4096))
	if err != nil {
		return "", err
	}
	if len(b) == 0 {
		return "", errors.New("empty answer")
	}
	return string(b), nil
}
