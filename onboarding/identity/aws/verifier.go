package aws

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	"github.com/embark-mesh/embark/onboarding/identity/aws/certs"
	"github.com/embark-mesh/embark/onboarding/identity/replay"
)

// Defaults of the options.
const (
	// DefaultSTSWindow is how old a signed STS request may be.
	DefaultSTSWindow = 5 * time.Minute
	// DefaultClockSkew is how far in the future a signed STS request may be
	// dated.
	DefaultClockSkew = 1 * time.Minute
	// DefaultSTSTimeout bounds one call to STS with the default HTTP client.
	DefaultSTSTimeout = 10 * time.Second
	// DefaultReplayCacheSize is how many used STS signatures a verifier
	// remembers.
	DefaultReplayCacheSize = 100_000
)

// Credential is the wire type [awswire.Credential]: what an EC2 instance
// presents.
type Credential = awswire.Credential

// Verifier verifies EC2 instance identities. It is safe for concurrent use.
type Verifier struct {
	audience    string
	trust       map[string]*x509.Certificate
	keys        map[string]trustedKey // trust's certificates with their keys, by region
	stsEndpoint *url.URL              // nil: AWS's regional endpoint for the document's region
	stsResolver sts.EndpointResolverV2
	httpClient  *http.Client
	now         func() time.Time
	stsWindow   time.Duration
	clockSkew   time.Duration
	log         *slog.Logger
	replay      *replay.Cache
	shared      replay.Shared // nil: replays are refused per verifier only
}

var _ identity.Verifier[Credential] = (*Verifier)(nil)

type options struct {
	trust       map[string]*x509.Certificate
	extra       map[string]*x509.Certificate
	stsEndpoint string
	httpClient  *http.Client
	now         func() time.Time
	window      time.Duration
	skew        time.Duration
	logger      *slog.Logger
	replaySize  int
	shared      replay.Shared
}

// Option configures a Verifier.
type Option func(*options)

// WithTrustedCertificates replaces the trust set: the AWS certificate of
// each region, keyed by region. Default (and with a nil set): the
// certificates embedded in package certs; an empty non-nil set trusts no
// region. Regions absent from the set are refused with
// ReasonUnknownRegion. Use certs.LoadDirPath to read a directory of
// <region>.pem files.
func WithTrustedCertificates(set map[string]*x509.Certificate) Option {
	return func(o *options) { o.trust = maps.Clone(set) }
}

// WithAdditionalCertificates adds certificates to the trust set, replacing
// the certificate of a region already in it (for a region AWS added, or a
// certificate AWS rotated). Applied after WithTrustedCertificates.
func WithAdditionalCertificates(set map[string]*x509.Certificate) Option {
	return func(o *options) {
		if o.extra == nil {
			o.extra = make(map[string]*x509.Certificate)
		}
		maps.Copy(o.extra, set)
	}
}

// WithSTSEndpoint sends every signed STS request to endpoint (e.g.
// "https://sts.us-east-1.amazonaws.com" or a test fake's URL) instead of
// the regional STS endpoint of the document's region. The agent must sign
// its request for the same endpoint.
func WithSTSEndpoint(endpoint string) Option {
	return func(o *options) { o.stsEndpoint = endpoint }
}

// WithHTTPClient sets the client used to call STS. Default: a client with a
// DefaultSTSTimeout timeout that follows no redirects.
func WithHTTPClient(c *http.Client) Option {
	return func(o *options) { o.httpClient = c }
}

// WithClock sets the verifier's clock. Default: time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithSTSFreshness sets how old a signed STS request may be (default
// DefaultSTSWindow) and how far in the future its X-Amz-Date may be
// (default DefaultClockSkew).
func WithSTSFreshness(window, skew time.Duration) Option {
	return func(o *options) { o.window, o.skew = window, skew }
}

// WithLogger sets the logger. Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithReplayCacheSize sets how many used STS request signatures the
// verifier remembers to refuse replays (default DefaultReplayCacheSize; 0
// disables the check).
func WithReplayCacheSize(n int) Option {
	return func(o *options) { o.replaySize = n }
}

// WithSharedReplay makes the verifier record every STS-confirmed request
// in store, shared by every replica of the deployment, and refuse one that
// another replica (or this one) already used. Default: none, replays are
// refused by this verifier's own cache only.
func WithSharedReplay(store replay.Shared) Option {
	return func(o *options) { o.shared = store }
}

// NewVerifier returns a Verifier for the onboarding plane named audience:
// signed STS requests must carry it in the signed AudienceHeader.
func NewVerifier(audience string, opts ...Option) (*Verifier, error) {
	if audience == "" {
		return nil, errors.New("aws identity verifier: audience must not be empty")
	}
	o := options{replaySize: DefaultReplayCacheSize}
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.setDefaults(); err != nil {
		return nil, fmt.Errorf("aws identity verifier: %w", err)
	}
	v := &Verifier{
		audience:    audience,
		trust:       o.trust,
		keys:        trustedKeys(o.trust),
		stsResolver: sts.NewDefaultEndpointResolverV2(),
		httpClient:  o.httpClient,
		now:         o.now,
		stsWindow:   o.window,
		clockSkew:   o.skew,
		log:         o.logger,
		replay:      replay.New(o.replaySize),
		shared:      o.shared,
	}
	if o.stsEndpoint != "" {
		u, err := url.Parse(o.stsEndpoint)
		if err != nil {
			return nil, fmt.Errorf("aws identity verifier: STS endpoint: %w", err)
		}
		if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("aws identity verifier: STS endpoint %q is not an http(s) URL", o.stsEndpoint)
		}
		v.stsEndpoint = u
	}
	return v, nil
}

func (o *options) setDefaults() error {
	if o.trust == nil {
		def, err := certs.Default()
		if err != nil {
			return err
		}
		o.trust = def
	}
	maps.Copy(o.trust, o.extra)
	for region, cert := range o.trust {
		if cert == nil {
			return fmt.Errorf("trust set: nil certificate for region %s", region)
		}
		if !awswire.IsRegionName(region) {
			return fmt.Errorf("trust set: %q is not an AWS region name", region)
		}
	}
	if o.httpClient == nil {
		o.httpClient = &http.Client{
			Timeout: DefaultSTSTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		}
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.window == 0 {
		o.window = DefaultSTSWindow
	}
	if o.skew == 0 {
		o.skew = DefaultClockSkew
	}
	if o.window < 0 || o.skew < 0 {
		return fmt.Errorf("STS freshness window %s and clock skew %s must not be negative", o.window, o.skew)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// trustedKeys takes each certificate's public key once, so that no
// verification parses or converts it again.
func trustedKeys(trust map[string]*x509.Certificate) map[string]trustedKey {
	keys := make(map[string]trustedKey, len(trust))
	for region, cert := range trust {
		keys[region] = newTrustedKey(cert)
	}
	return keys
}

// Regions returns the regions of the trust set, sorted.
func (v *Verifier) Regions() []string {
	return slices.Sorted(maps.Keys(v.trust))
}

// Certificate returns the certificate trusted for region.
func (v *Verifier) Certificate(region string) (*x509.Certificate, bool) {
	c, ok := v.trust[region]
	return c, ok
}

// VerifyDocument verifies an instance identity document and its rsa2048
// signature: the signature must be a PKCS#7 SignedData with one signer,
// the signed content must be document byte for byte, the document's region
// must be in the trust set, and the signature must verify with that
// region's certificate alone. The document's age is not checked.
func (v *Verifier) VerifyDocument(document, signature []byte) (*Document, error) {
	der, err := DecodeSignature(signature)
	if err != nil {
		return nil, err
	}
	sd, err := parsePKCS7(der)
	if err != nil {
		return nil, err
	}
	if err := checkContent(sd, document); err != nil {
		return nil, err
	}
	doc, err := ParseDocument(document)
	if err != nil {
		return nil, err
	}
	key, ok := v.keys[doc.Region]
	if !ok {
		return nil, identity.Refuse(identity.ReasonUnknownRegion, "no AWS certificate is configured for region %s (a new AWS region? add its certificate to the trust set)", doc.Region)
	}
	if err := verifySigner(sd, key, doc.Region); err != nil {
		return nil, err
	}
	return doc, nil
}

// Verify verifies cred and returns the instance's identity. Without
// cred.STS the identity has no IAM role. With it, the signed request must
// be bound to this verifier's audience and fresh, is sent to STS, and STS
// must answer with the assumed-role session of the document's instance in
// the document's account and partition.
func (v *Verifier) Verify(ctx context.Context, cred Credential) (*identity.Identity, error) {
	doc, err := v.VerifyDocument(cred.Document, cred.Signature)
	if err != nil {
		return nil, err
	}
	id := &identity.Identity{
		Method: identity.MethodAWSInstanceIdentityDocument,
		AWS: &identity.AWSIdentity{
			Partition:    doc.Partition(),
			Account:      doc.AccountID,
			Region:       doc.Region,
			Zone:         doc.AvailabilityZone,
			InstanceID:   doc.InstanceID,
			InstanceType: doc.InstanceType,
			ImageID:      doc.ImageID,
			PrivateIP:    doc.PrivateIP,
			PendingTime:  doc.PendingTimeOrZero(),
		},
	}
	if cred.STS == nil {
		return id, nil
	}
	caller, err := v.verifySTS(ctx, cred.STS, doc)
	if err != nil {
		return nil, err
	}
	id.Method = identity.MethodAWSInstanceIdentityDocumentAndSTS
	id.AWS.STSProven = true
	id.AWS.IAMRole = caller.RoleName
	id.AWS.CallerARN = caller.arn
	return id, nil
}

type verifiedCaller struct {
	*AssumedRoleARN
	arn string
}

// Caller is who a signed sts:GetCallerIdentity request proved: the
// assumed-role session STS answered with.
type Caller struct {
	AssumedRoleARN
	// ARN is the caller ARN exactly as STS answered it.
	ARN string
}

// VerifyCaller checks a signed sts:GetCallerIdentity request as Verify
// checks an EC2 instance's (bound to this verifier's audience, fresh, sent
// to the STS endpoint of region, each request used once) and returns the
// assumed-role session STS answered with. Other platforms whose identity is
// a role session (ECS tasks) use it; it checks nothing about the session's
// name.
func (v *Verifier) VerifyCaller(ctx context.Context, req *STSRequest, region string) (*Caller, error) {
	arn, account, err := v.confirmSTS(ctx, req, region)
	if err != nil {
		return nil, err
	}
	a, err := ParseAssumedRoleARN(arn)
	if err != nil {
		return nil, err
	}
	if account != "" && account != a.Account {
		return nil, identity.Refuse(identity.ReasonAccountMismatch, "STS answered with account %s and caller %s of another account", account, arn)
	}
	return &Caller{AssumedRoleARN: *a, ARN: arn}, nil
}

func (v *Verifier) verifySTS(ctx context.Context, req *STSRequest, doc *Document) (*verifiedCaller, error) {
	arn, account, err := v.confirmSTS(ctx, req, doc.Region)
	if err != nil {
		v.log.DebugContext(ctx, "STS did not confirm signed request", "instance", doc.InstanceID, "error", err)
		return nil, err
	}
	caller, err := matchCaller(arn, account, doc)
	if err != nil {
		return nil, err
	}
	return &verifiedCaller{AssumedRoleARN: caller, arn: arn}, nil
}

// confirmSTS makes the local checks of a signed request for region's STS
// endpoint, refuses one used before, sends it to STS and returns the caller
// ARN and account STS answered with.
func (v *Verifier) confirmSTS(ctx context.Context, req *STSRequest, region string) (arn, account string, err error) {
	endpoint, err := v.endpointFor(ctx, region)
	if err != nil {
		return "", "", err
	}
	checked, err := v.checkSTSRequest(req, endpoint, v.now())
	if err != nil {
		return "", "", err
	}
	key, expiry := checked.auth.signature, checked.signedAt.Add(v.stsWindow)
	if !v.replay.Reserve(key, expiry, v.now()) {
		return "", "", stsReplayed(checked)
	}
	arn, account, err = v.callSTS(ctx, req, checked, endpoint)
	if err != nil {
		v.replay.Release(key)
		return "", "", err
	}
	// Only a request STS confirmed costs a write to the shared store.
	if err := v.reserveShared(ctx, key, expiry, checked); err != nil {
		return "", "", err
	}
	return arn, account, nil
}

// reserveShared records the request signed with key in the deployment's
// shared store, if any, refusing it when another replica used it. When the
// store cannot tell, the local reservation is released so that the agent
// may retry the same request.
func (v *Verifier) reserveShared(ctx context.Context, key string, expiry time.Time, checked *checkedSTSRequest) error {
	if v.shared == nil {
		return nil
	}
	fresh, err := v.shared.Reserve(ctx, "sts\x00"+key, expiry)
	if err != nil {
		v.replay.Release(key)
		return fmt.Errorf("check the signed STS request against the ones already used: %w", err)
	}
	if !fresh {
		return stsReplayed(checked)
	}
	return nil
}

// stsReplayed is the refusal of a signed STS request used before.
func stsReplayed(checked *checkedSTSRequest) error {
	return identity.Refuse(identity.ReasonSTSReplayed, "this signed STS request (signed at %s) was already used; the agent must sign a new one for every onboarding", checked.signedAt.Format(time.RFC3339))
}

// endpointFor returns where STS requests of region go.
func (v *Verifier) endpointFor(ctx context.Context, region string) (*url.URL, error) {
	if v.stsEndpoint != nil {
		return v.stsEndpoint, nil
	}
	ep, err := v.stsResolver.ResolveEndpoint(ctx, sts.EndpointParameters{
		Region:            sdkaws.String(region),
		UseGlobalEndpoint: sdkaws.Bool(false),
		UseDualStack:      sdkaws.Bool(false),
		UseFIPS:           sdkaws.Bool(false),
	})
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonSTSUnavailable, err, "no STS endpoint for region %s", region)
	}
	return &ep.URI, nil
}
