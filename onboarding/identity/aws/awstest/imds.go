package awstest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Header names of IMDSv2.
const (
	imdsTokenHeader    = "X-Aws-Ec2-Metadata-Token"
	imdsTokenTTLHeader = "X-Aws-Ec2-Metadata-Token-Ttl-Seconds"
)

// IMDS is a loopback fake of the EC2 instance metadata service of one
// instance, IMDSv2 only. Create it with [NewIMDS]; Close it when done.
//
// It serves PUT /latest/api/token and, with a valid token,
// /latest/dynamic/instance-identity/{document,rsa2048},
// /latest/meta-data/{instance-id,local-ipv4,placement/availability-zone,placement/region},
// /latest/meta-data/iam/info and
// /latest/meta-data/iam/security-credentials/[<role>]. Everything else is
// 404; a request without a valid token is 401.
type IMDS struct {
	// URL is the endpoint, http://127.0.0.1:<port>.
	URL string

	instance  Instance
	document  []byte
	signature []byte
	sts       *STS
	credTTL   time.Duration
	now       func() time.Time
	server    *httptest.Server

	mu     sync.Mutex
	tokens map[string]time.Time
	creds  *Credentials
	gets   map[string]int
}

// IMDSOption configures an IMDS fake.
type IMDSOption func(*IMDS)

// WithRoleCredentialsFrom makes the IMDS serve credentials for the
// instance's Role issued by sts, renewed when less than 5 minutes remain.
// Without it the instance has no instance profile credentials.
func WithRoleCredentialsFrom(sts *STS) IMDSOption {
	return func(m *IMDS) { m.sts = sts }
}

// WithCredentialTTL sets the lifetime of issued role credentials (default
// 6h, as EC2).
func WithCredentialTTL(ttl time.Duration) IMDSOption {
	return func(m *IMDS) { m.credTTL = ttl }
}

// WithSignature makes the IMDS serve sig as the rsa2048 signature instead
// of ca's signature of the document (e.g. a forged one).
func WithSignature(sig []byte) IMDSOption {
	return func(m *IMDS) { m.signature = sig }
}

// NewIMDS starts an IMDS fake for inst on 127.0.0.1, whose document is
// signed by ca.
func NewIMDS(ca *CA, inst Instance, opts ...IMDSOption) (*IMDS, error) {
	inst = inst.withDefaults()
	m := &IMDS{
		instance: inst,
		document: inst.Document(),
		credTTL:  6 * time.Hour,
		now:      time.Now,
		tokens:   make(map[string]time.Time),
		gets:     make(map[string]int),
	}
	for _, o := range opts {
		o(m)
	}
	if m.signature == nil {
		sig, err := ca.Sign(m.document)
		if err != nil {
			return nil, fmt.Errorf("sign instance identity document: %w", err)
		}
		m.signature = sig
	}
	m.server = httptest.NewServer(http.HandlerFunc(m.serve))
	m.URL = m.server.URL
	return m, nil
}

// Close shuts the server down.
func (m *IMDS) Close() { m.server.Close() }

// Instance returns the instance, with defaults filled in.
func (m *IMDS) Instance() Instance { return m.instance }

// Document returns the document the IMDS serves.
func (m *IMDS) Document() []byte { return append([]byte(nil), m.document...) }

// Signature returns the rsa2048 signature the IMDS serves.
func (m *IMDS) Signature() []byte { return append([]byte(nil), m.signature...) }

// Gets returns how many authorised GETs of path the fake served.
func (m *IMDS) Gets(path string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gets[path]
}

func (m *IMDS) serve(w http.ResponseWriter, r *http.Request) {
	// Like EC2, refuse anything that came through a proxy.
	if r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	if r.URL.Path == "/latest/api/token" {
		m.serveToken(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	if !m.validToken(r.Header.Get(imdsTokenHeader)) {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	m.mu.Lock()
	m.gets[r.URL.Path]++
	m.mu.Unlock()

	inst := m.instance
	text := func(s string) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte(s))
	}
	switch p := r.URL.Path; p {
	case "/latest/dynamic/instance-identity/document":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(m.document)
	case "/latest/dynamic/instance-identity/rsa2048":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(m.signature)
	case "/latest/meta-data/instance-id":
		text(inst.InstanceID)
	case "/latest/meta-data/local-ipv4":
		text(inst.PrivateIP)
	case "/latest/meta-data/placement/availability-zone":
		text(inst.Zone)
	case "/latest/meta-data/placement/region":
		text(inst.Region)
	case "/latest/meta-data/iam/info":
		if !m.hasRole() {
			http.NotFound(w, r)
			return
		}
		writeJSON(w, map[string]string{
			"Code":               "Success",
			"LastUpdated":        m.now().UTC().Format(time.RFC3339),
			"InstanceProfileArn": InstanceProfileARN(inst),
			"InstanceProfileId":  "AIPA" + strings.ToUpper(randomHex(8)),
		})
	case "/latest/meta-data/iam/security-credentials", "/latest/meta-data/iam/security-credentials/":
		if !m.hasRole() {
			http.NotFound(w, r)
			return
		}
		text(inst.Role)
	default:
		role, ok := strings.CutPrefix(p, "/latest/meta-data/iam/security-credentials/")
		if !ok || !m.hasRole() || role != inst.Role {
			http.NotFound(w, r)
			return
		}
		c := m.roleCredentials()
		writeJSON(w, map[string]string{
			"Code":            "Success",
			"LastUpdated":     m.now().UTC().Format(time.RFC3339),
			"Type":            "AWS-HMAC",
			"AccessKeyId":     c.AccessKeyID,
			"SecretAccessKey": c.SecretAccessKey,
			"Token":           c.SessionToken,
			"Expiration":      c.Expiration.UTC().Format(time.RFC3339),
		})
	}
}

func (m *IMDS) hasRole() bool { return m.sts != nil && m.instance.Role != "" }

// RoleCredentials returns the instance profile credentials the IMDS
// currently serves, issuing them if needed.
func (m *IMDS) RoleCredentials() (Credentials, bool) {
	if !m.hasRole() {
		return Credentials{}, false
	}
	return m.roleCredentials(), true
}

func (m *IMDS) roleCredentials() Credentials {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.creds == nil || m.creds.Expiration.Sub(m.now()) < 5*time.Minute {
		inst := m.instance
		c := m.sts.IssueRole(inst.Partition(), inst.Account, inst.Role, inst.InstanceID, m.credTTL)
		m.creds = &c
	}
	return *m.creds
}

func (m *IMDS) serveToken(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	ttl, err := strconv.Atoi(r.Header.Get(imdsTokenTTLHeader))
	if err != nil || ttl < 1 || ttl > 21600 {
		http.Error(w, "Bad Request", http.StatusBadRequest)
		return
	}
	tok := randomHex(28)
	m.mu.Lock()
	m.tokens[tok] = m.now().Add(time.Duration(ttl) * time.Second)
	m.mu.Unlock()
	w.Header().Set(imdsTokenTTLHeader, strconv.Itoa(ttl))
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(tok))
}

func (m *IMDS) validToken(tok string) bool {
	if tok == "" {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	exp, ok := m.tokens[tok]
	return ok && m.now().Before(exp)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "text/plain")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away if this fails
}
