package aws

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/arn"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

// AudienceHeader is [awswire.AudienceHeader], the signed header that binds
// an STS proof to one onboarding plane.
const AudienceHeader = awswire.AudienceHeader

// STS request and answer limits.
const (
	// MaxSTSRequestBodySize bounds the signed request's body.
	MaxSTSRequestBodySize = 4 << 10
	// MaxSTSHeaderBytes bounds the total size of the signed request's headers.
	MaxSTSHeaderBytes  = 16 << 10
	maxSTSResponseSize = 64 << 10
	amzDateFormat      = "20060102T150405Z"
	sigV4Algorithm     = "AWS4-HMAC-SHA256"
)

// STSRequest is the wire type [awswire.STSRequest]: a signed
// sts:GetCallerIdentity request made with the instance's role credentials.
type STSRequest = awswire.STSRequest

// sigV4Authorization is the parsed Authorization header of a SigV4 request.
type sigV4Authorization struct {
	accessKeyID   string
	date          string // yyyymmdd of the credential scope
	region        string
	service       string
	signedHeaders []string
	signature     string
}

var hexSignature = regexp.MustCompile(`^[0-9a-f]{64}$`)

func parseSigV4Authorization(v string) (*sigV4Authorization, error) {
	alg, rest, ok := strings.Cut(v, " ")
	if !ok || alg != sigV4Algorithm {
		return nil, fmt.Errorf("authorization is not %s", sigV4Algorithm)
	}
	fields := map[string]string{}
	for part := range strings.SplitSeq(rest, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("authorization component %q has no '='", part)
		}
		if _, dup := fields[k]; dup {
			return nil, fmt.Errorf("authorization component %s repeated", k)
		}
		fields[k] = val
	}
	if len(fields) != 3 {
		return nil, errors.New("authorization must have exactly Credential, SignedHeaders and Signature")
	}
	scope := strings.Split(fields["Credential"], "/")
	if len(scope) != 5 || scope[0] == "" || scope[4] != "aws4_request" {
		return nil, fmt.Errorf("credential scope %q is not <key>/<date>/<region>/<service>/aws4_request", fields["Credential"])
	}
	if !hexSignature.MatchString(fields["Signature"]) {
		return nil, errors.New("signature is not 64 lower-case hex digits")
	}
	signed := strings.Split(fields["SignedHeaders"], ";")
	if !slices.IsSorted(signed) || slices.Contains(signed, "") {
		return nil, fmt.Errorf("SignedHeaders %q is not a sorted list of header names", fields["SignedHeaders"])
	}
	return &sigV4Authorization{
		accessKeyID: scope[0], date: scope[1], region: scope[2], service: scope[3],
		signedHeaders: signed, signature: fields["Signature"],
	}, nil
}

// checkedSTSRequest is a signed request that passed the local checks.
type checkedSTSRequest struct {
	auth     *sigV4Authorization
	signedAt time.Time
	header   http.Header // canonicalised copy of the request's headers
	host     string
}

func singleHeader(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	switch len(vs) {
	case 0:
		return "", fmt.Errorf("header %s is missing", name)
	case 1:
		return vs[0], nil
	default:
		return "", fmt.Errorf("header %s is repeated", name)
	}
}

func sameHost(a, b *url.URL) bool {
	port := func(u *url.URL) string {
		if p := u.Port(); p != "" {
			return p
		}
		if u.Scheme == "http" {
			return "80"
		}
		return "443"
	}
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

// checkSTSRequest makes every check that needs no call to STS: shape,
// destination, binding to audience, freshness.
func (v *Verifier) checkSTSRequest(req *STSRequest, endpoint *url.URL, now time.Time) (*checkedSTSRequest, error) {
	invalid := func(format string, args ...any) error {
		return identity.Refuse(identity.ReasonSTSRequestInvalid, format, args...)
	}
	if req.Method != http.MethodPost {
		return nil, invalid("signed request method is %q, want POST", req.Method)
	}
	u, err := url.Parse(req.URL)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonSTSRequestInvalid, err, "signed request URL")
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return nil, invalid("signed request URL %q must be the STS endpoint's root with no query", req.URL)
	}
	if !sameHost(u, endpoint) {
		return nil, invalid("signed request is for %s://%s, this verifier sends STS requests for the region to %s://%s", u.Scheme, u.Host, endpoint.Scheme, endpoint.Host)
	}
	if len(req.Body) > MaxSTSRequestBodySize {
		return nil, invalid("signed request body is %d bytes, more than %d", len(req.Body), MaxSTSRequestBodySize)
	}
	form, err := url.ParseQuery(string(req.Body))
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonSTSRequestInvalid, err, "signed request body is not a form")
	}
	if len(form) != 2 || !slices.Equal(form["Action"], []string{"GetCallerIdentity"}) || !slices.Equal(form["Version"], []string{"2011-06-15"}) {
		return nil, invalid("signed request body %q is not Action=GetCallerIdentity&Version=2011-06-15", truncate(string(req.Body), 200))
	}

	header := http.Header{}
	size := 0
	for k, vs := range req.Headers {
		for _, val := range vs {
			size += len(k) + len(val)
			header.Add(k, val)
		}
	}
	if size > MaxSTSHeaderBytes {
		return nil, invalid("signed request headers are %d bytes, more than %d", size, MaxSTSHeaderBytes)
	}
	authz, err := singleHeader(header, "Authorization")
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonSTSRequestInvalid, err, "signed request")
	}
	auth, err := parseSigV4Authorization(authz)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonSTSRequestInvalid, err, "signed request's Authorization header")
	}
	if auth.service != "sts" {
		return nil, invalid("signed request is signed for service %q, want sts", auth.service)
	}
	for _, h := range []string{"host", "x-amz-date"} {
		if !slices.Contains(auth.signedHeaders, h) {
			return nil, invalid("signed request does not sign the %s header", h)
		}
	}

	// Binding to this onboarding plane.
	audienceKey := strings.ToLower(AudienceHeader)
	if !slices.Contains(auth.signedHeaders, audienceKey) {
		return nil, identity.Refuse(identity.ReasonSTSUnbound, "signed request does not include %s in its SignedHeaders; it is not bound to this onboarding endpoint", AudienceHeader)
	}
	audience, err := singleHeader(header, AudienceHeader)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonSTSUnbound, err, "signed request")
	}
	if audience != v.audience {
		return nil, identity.Refuse(identity.ReasonSTSUnbound, "signed request is bound to audience %q, this endpoint's audience is %q", truncate(audience, 200), v.audience)
	}

	// Freshness.
	date, err := singleHeader(header, "X-Amz-Date")
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonSTSRequestInvalid, err, "signed request")
	}
	signedAt, err := time.Parse(amzDateFormat, date)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonSTSRequestInvalid, err, "signed request's X-Amz-Date")
	}
	if auth.date != signedAt.Format("20060102") {
		return nil, invalid("credential scope date %s is not the date of X-Amz-Date %s", auth.date, date)
	}
	if age := now.Sub(signedAt); age > v.stsWindow {
		return nil, identity.Refuse(identity.ReasonSTSStale, "signed request was signed at %s, %s ago; requests older than %s are refused", signedAt.Format(time.RFC3339), age.Round(time.Second), v.stsWindow)
	} else if -age > v.clockSkew {
		return nil, identity.Refuse(identity.ReasonSTSStale, "signed request was signed at %s, %s in the future; more than the allowed clock skew of %s (check the VM's clock)", signedAt.Format(time.RFC3339), (-age).Round(time.Second), v.clockSkew)
	}
	return &checkedSTSRequest{auth: auth, signedAt: signedAt, header: header, host: u.Host}, nil
}

// callSTS sends the checked request to endpoint and returns the caller ARN
// and account STS answered with.
func (v *Verifier) callSTS(ctx context.Context, req *STSRequest, checked *checkedSTSRequest, endpoint *url.URL) (arn, account string, err error) {
	target := *endpoint
	target.Path = "/"
	target.RawQuery = ""
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(req.Body))
	if err != nil {
		return "", "", identity.RefuseWrap(identity.ReasonSTSUnavailable, err, "build STS request")
	}
	hreq.Host = checked.host
	// Forward exactly what was signed, and the signature.
	for _, name := range checked.auth.signedHeaders {
		switch name {
		case "host", "content-length":
			continue // set by net/http from Host and the body
		}
		for _, val := range checked.header.Values(name) {
			hreq.Header.Add(name, val)
		}
	}
	hreq.Header.Set("Authorization", checked.header.Get("Authorization"))

	resp, err := v.httpClient.Do(hreq)
	if err != nil {
		return "", "", identity.RefuseWrap(identity.ReasonSTSUnavailable, err, "call STS at %s", endpoint.Host)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSTSResponseSize+1))
	if err != nil {
		return "", "", identity.RefuseWrap(identity.ReasonSTSUnavailable, err, "read STS answer")
	}
	if len(body) > maxSTSResponseSize {
		return "", "", identity.Refuse(identity.ReasonSTSUnavailable, "STS answer is larger than %d bytes", maxSTSResponseSize)
	}
	if resp.StatusCode != http.StatusOK {
		var e stsErrorResponse
		code, msg := "unknown", truncate(string(body), 300)
		if xml.Unmarshal(body, &e) == nil && e.Error.Code != "" {
			code, msg = e.Error.Code, e.Error.Message
		}
		reason := identity.ReasonSTSRejected
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || stsRetryableCodes[code] {
			reason = identity.ReasonSTSUnavailable
		}
		return "", "", identity.Refuse(reason, "STS answered %d %s: %s", resp.StatusCode, code, msg)
	}
	var out getCallerIdentityResponse
	if err := xml.Unmarshal(body, &out); err != nil {
		return "", "", identity.RefuseWrap(identity.ReasonSTSUnavailable, err, "STS answer is not a GetCallerIdentityResponse")
	}
	if out.Result.Arn == "" {
		return "", "", identity.Refuse(identity.ReasonSTSUnavailable, "STS answer carries no caller ARN")
	}
	return out.Result.Arn, out.Result.Account, nil
}

type getCallerIdentityResponse struct {
	XMLName xml.Name `xml:"GetCallerIdentityResponse"`
	Result  struct {
		Arn     string `xml:"Arn"`
		UserID  string `xml:"UserId"`
		Account string `xml:"Account"`
	} `xml:"GetCallerIdentityResult"`
}

// stsRetryableCodes are STS error codes that say nothing about the
// request's credentials: STS is throttling or failing (its Query protocol
// answers throttling with 400, so the status alone does not tell).
var stsRetryableCodes = map[string]bool{
	"Throttling": true, "ThrottlingException": true, "RequestLimitExceeded": true,
	"ServiceUnavailable": true, "InternalFailure": true, "RequestTimeout": true,
}

type stsErrorResponse struct {
	XMLName xml.Name `xml:"ErrorResponse"`
	Error   struct {
		Type    string `xml:"Type"`
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	} `xml:"Error"`
}

// AssumedRoleARN is a parsed arn:<partition>:sts::<account>:assumed-role/<role>/<session>.
type AssumedRoleARN struct {
	Partition   string
	Account     string
	RoleName    string
	SessionName string
}

// ParseAssumedRoleARN parses an STS assumed-role ARN. Any other kind of ARN
// (IAM user, federated user, root) is refused with ReasonNotAssumedRole.
func ParseAssumedRoleARN(caller string) (*AssumedRoleARN, error) {
	a, err := arn.Parse(caller)
	if err != nil || a.Partition == "" {
		return nil, identity.Refuse(identity.ReasonNotAssumedRole, "caller %q is not an ARN", truncate(caller, 200))
	}
	if a.Service != "sts" || a.Region != "" {
		return nil, identity.Refuse(identity.ReasonNotAssumedRole, "caller %s is not an STS assumed-role session", caller)
	}
	resource, ok := strings.CutPrefix(a.Resource, "assumed-role/")
	if !ok {
		return nil, identity.Refuse(identity.ReasonNotAssumedRole, "caller %s is not an STS assumed-role session (an EC2 instance profile session is arn:<partition>:sts::<account>:assumed-role/<role>/<instance-id>)", caller)
	}
	role, session, ok := strings.Cut(resource, "/")
	if !ok || role == "" || session == "" || strings.Contains(session, "/") {
		return nil, identity.Refuse(identity.ReasonNotAssumedRole, "caller %s is not of the form assumed-role/<role>/<session>", caller)
	}
	if !awswire.IsAccountID(a.AccountID) {
		return nil, identity.Refuse(identity.ReasonNotAssumedRole, "caller %s has no 12-digit account", caller)
	}
	return &AssumedRoleARN{Partition: a.Partition, Account: a.AccountID, RoleName: role, SessionName: session}, nil
}

// matchCaller checks that the STS caller is the document's instance.
func matchCaller(arn, account string, doc *Document) (*AssumedRoleARN, error) {
	a, err := ParseAssumedRoleARN(arn)
	if err != nil {
		return nil, err
	}
	if account != "" && account != a.Account {
		return nil, identity.Refuse(identity.ReasonAccountMismatch, "STS answered with account %s and caller %s of another account", account, arn)
	}
	if want := doc.Partition(); a.Partition != want {
		return nil, identity.Refuse(identity.ReasonPartitionMismatch, "STS caller %s is in partition %s, the document's region %s is in %s", arn, a.Partition, doc.Region, want)
	}
	if a.Account != doc.AccountID {
		return nil, identity.Refuse(identity.ReasonAccountMismatch, "STS caller %s is in account %s, the document is of account %s", arn, a.Account, doc.AccountID)
	}
	if a.SessionName != doc.InstanceID {
		return nil, identity.Refuse(identity.ReasonInstanceMismatch, "STS caller %s is a session of %q, the document is of instance %s", arn, a.SessionName, doc.InstanceID)
	}
	return a, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
