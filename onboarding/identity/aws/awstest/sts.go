package awstest

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Credentials are temporary AWS credentials issued by the fake STS.
type Credentials struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	Expiration      time.Time
}

// Principal is who a set of credentials belongs to, as GetCallerIdentity
// reports it.
type Principal struct {
	// ARN, e.g. arn:aws:sts::123456789012:assumed-role/ratings-role/i-1234567890abcdef0.
	ARN string
	// Account, e.g. 123456789012.
	Account string
	// UserID, e.g. AROAEXAMPLE:i-1234567890abcdef0.
	UserID string
}

type issued struct {
	creds     Credentials
	principal Principal
}

// STS is a loopback fake of the AWS Security Token Service answering
// GetCallerIdentity. Create it with [NewSTS]; Close it when done.
//
// It accepts a request only if its SigV4 signature (AWS4-HMAC-SHA256,
// service sts, any region) verifies with the secret of an access key it
// issued and has not revoked, the session token matches and is signed (as
// the SDK signs it), the credentials have not expired, and X-Amz-Date is
// within 15 minutes of its clock. Otherwise it answers with AWS's error
// XML and code (SignatureDoesNotMatch, InvalidClientTokenId, ExpiredToken,
// IncompleteSignature, MissingAuthenticationToken, InvalidAction).
type STS struct {
	// URL is the endpoint, http://127.0.0.1:<port>.
	URL string

	server *httptest.Server
	now    func() time.Time

	mu      sync.Mutex
	keys    map[string]issued
	calls   int
	answers int
	outage  *stsError // answered to every request while set
}

// STSOption configures an STS fake.
type STSOption func(*STS)

// WithSTSClock sets the fake's clock (default time.Now); it decides whether
// a signature is too old (15 minutes) and whether credentials expired.
func WithSTSClock(now func() time.Time) STSOption {
	return func(s *STS) { s.now = now }
}

// NewSTS starts an STS fake on 127.0.0.1.
func NewSTS(opts ...STSOption) *STS {
	s := &STS{now: time.Now, keys: make(map[string]issued)}
	for _, o := range opts {
		o(s)
	}
	s.server = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.server.URL
	return s
}

// Close shuts the server down.
func (s *STS) Close() { s.server.Close() }

// Issue creates credentials for principal valid for ttl.
func (s *STS) Issue(principal Principal, ttl time.Duration) Credentials {
	c := Credentials{
		AccessKeyID:     "ASIA" + strings.ToUpper(randomHex(8)),
		SecretAccessKey: randomHex(20),
		SessionToken:    "FwoG" + randomHex(64),
		Expiration:      s.now().Add(ttl).UTC().Truncate(time.Second),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[c.AccessKeyID] = issued{creds: c, principal: principal}
	return c
}

// IssueRole creates credentials for the role session <role>/<session> in
// account, as EC2 does for an instance profile (session = instance ID).
func (s *STS) IssueRole(partition, account, role, session string, ttl time.Duration) Credentials {
	return s.Issue(Principal{
		ARN:     AssumedRoleARN(partition, account, role, session),
		Account: account,
		UserID:  "AROA" + strings.ToUpper(randomHex(8)) + ":" + session,
	}, ttl)
}

// Revoke makes credentials with the access key ID unknown to STS.
func (s *STS) Revoke(accessKeyID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys, accessKeyID)
}

// SetOutage makes the fake answer every request as AWS does when STS is
// overloaded or failing, until ClearOutage: "Throttling" answers 400
// Throttling (STS's Query protocol throttles with 400, not 429),
// "ServiceUnavailable" 503 and "InternalFailure" 500.
func (s *STS) SetOutage(code string) {
	e := &stsError{typ: "Receiver", code: code, message: "Rate exceeded"}
	switch code {
	case "Throttling":
		e.status, e.typ = http.StatusBadRequest, "Sender"
	case "ServiceUnavailable":
		e.status, e.message = http.StatusServiceUnavailable, "Service is unavailable. Please try again later."
	default:
		e.status, e.message = http.StatusInternalServerError, "An internal error has occurred."
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outage = e
}

// ClearOutage ends an outage started with SetOutage.
func (s *STS) ClearOutage() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outage = nil
}

// Calls returns how many requests reached the fake.
func (s *STS) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Answers returns how many GetCallerIdentity requests the fake answered
// with success.
func (s *STS) Answers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.answers
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

type stsError struct {
	status  int
	typ     string
	code    string
	message string
}

func senderError(status int, code, message string) *stsError {
	return &stsError{status: status, typ: "Sender", code: code, message: message}
}

func (s *STS) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.calls++
	outage := s.outage
	s.mu.Unlock()
	if outage != nil {
		writeSTSError(w, outage)
		return
	}
	p, e := s.authenticate(r)
	if e != nil {
		writeSTSError(w, e)
		return
	}
	s.mu.Lock()
	s.answers++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/xml")
	_, _ = fmt.Fprintf(w, `<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <GetCallerIdentityResult>
    <Arn>%s</Arn>
    <UserId>%s</UserId>
    <Account>%s</Account>
  </GetCallerIdentityResult>
  <ResponseMetadata>
    <RequestId>%s</RequestId>
  </ResponseMetadata>
</GetCallerIdentityResponse>
`, xmlEscape(p.ARN), xmlEscape(p.UserID), xmlEscape(p.Account), requestID())
}

// authenticate checks r as STS would and returns the caller.
func (s *STS) authenticate(r *http.Request) (*Principal, *stsError) {
	if r.Method != http.MethodPost && r.Method != http.MethodGet {
		return nil, senderError(http.StatusMethodNotAllowed, "MethodNotAllowed", "method not allowed")
	}
	if r.URL.Path != "/" {
		return nil, senderError(http.StatusNotFound, "UnknownOperationException", "unknown path")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		return nil, senderError(http.StatusBadRequest, "MalformedQueryString", "cannot read body")
	}
	params := r.URL.Query()
	if r.Method == http.MethodPost {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, senderError(http.StatusBadRequest, "MalformedQueryString", "malformed form body")
		}
		for k, vs := range form {
			params[k] = append(params[k], vs...)
		}
	}

	authz := r.Header.Get("Authorization")
	if authz == "" {
		return nil, senderError(http.StatusForbidden, "MissingAuthenticationToken", "Request is missing Authentication Token")
	}
	sig, err := parseSigV4(authz)
	if err != nil {
		return nil, senderError(http.StatusBadRequest, "IncompleteSignature", err.Error())
	}
	if sig.service != "sts" || sig.region == "" {
		return nil, senderError(http.StatusForbidden, "SignatureDoesNotMatch", "Credential should be scoped to correct service: 'sts'.")
	}
	amzDate := r.Header.Get("X-Amz-Date")
	signedAt, err := time.Parse("20060102T150405Z", amzDate)
	if err != nil {
		return nil, senderError(http.StatusBadRequest, "IncompleteSignature", "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.")
	}
	if sig.date != signedAt.Format("20060102") {
		return nil, senderError(http.StatusForbidden, "SignatureDoesNotMatch", "Credential should be scoped to a valid date: "+sig.date)
	}
	now := s.now()
	if d := now.Sub(signedAt); d > 15*time.Minute || d < -15*time.Minute {
		return nil, senderError(http.StatusForbidden, "SignatureDoesNotMatch", fmt.Sprintf("Signature expired: %s is now earlier than %s (%s - 15 min.)",
			amzDate, now.Add(-15*time.Minute).UTC().Format("20060102T150405Z"), now.UTC().Format("20060102T150405Z")))
	}
	for _, required := range []string{"host", "x-amz-date"} {
		found := false
		for _, h := range sig.signedHeaders {
			found = found || h == required
		}
		if !found {
			return nil, senderError(http.StatusForbidden, "SignatureDoesNotMatch", "header "+required+" must be signed")
		}
	}

	s.mu.Lock()
	is, ok := s.keys[sig.accessKeyID]
	s.mu.Unlock()
	if !ok || !hmac.Equal([]byte(r.Header.Get("X-Amz-Security-Token")), []byte(is.creds.SessionToken)) {
		return nil, senderError(http.StatusForbidden, "InvalidClientTokenId", "The security token included in the request is invalid.")
	}
	tokenSigned := false
	for _, h := range sig.signedHeaders {
		tokenSigned = tokenSigned || h == "x-amz-security-token"
	}
	if !tokenSigned {
		return nil, senderError(http.StatusForbidden, "SignatureDoesNotMatch", "x-amz-security-token must be signed")
	}
	if !now.Before(is.creds.Expiration) {
		return nil, senderError(http.StatusForbidden, "ExpiredToken", "The security token included in the request is expired")
	}
	canonical, err := canonicalRequest(r, body, sig.signedHeaders)
	if err != nil {
		return nil, senderError(http.StatusForbidden, "SignatureDoesNotMatch", err.Error())
	}
	want := expectedSignature(is.creds.SecretAccessKey, amzDate, sig, canonical)
	if !hmac.Equal([]byte(want), []byte(sig.signature)) {
		return nil, senderError(http.StatusForbidden, "SignatureDoesNotMatch",
			"The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.")
	}
	if params.Get("Action") != "GetCallerIdentity" {
		return nil, senderError(http.StatusBadRequest, "InvalidAction", fmt.Sprintf("Could not find operation %s for version %s", params.Get("Action"), params.Get("Version")))
	}
	if params.Get("Version") != "2011-06-15" {
		return nil, senderError(http.StatusBadRequest, "InvalidAction", "Could not find operation GetCallerIdentity for version "+params.Get("Version"))
	}
	p := is.principal
	return &p, nil
}

func writeSTSError(w http.ResponseWriter, e *stsError) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(e.status)
	_, _ = fmt.Fprintf(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <Error>
    <Type>%s</Type>
    <Code>%s</Code>
    <Message>%s</Message>
  </Error>
  <RequestId>%s</RequestId>
</ErrorResponse>
`, e.typ, e.code, xmlEscape(e.message), requestID())
}

func xmlEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // writing to a strings.Builder never fails
	return b.String()
}

func requestID() string {
	h := randomHex(16)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
