// Package gcetest is a loopback Google for tests: a JWKS endpoint (TLS, like
// https://www.googleapis.com/oauth2/v3/certs) whose key signs instance
// identity tokens as Google does, a Compute Engine metadata server that
// issues them to an instance, and a Compute API (with Google's OAuth token
// endpoint) that describes instances.
package gcetest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/jwt/jwttest"
)

// Google serves its JWKS over TLS at /oauth2/v3/certs and signs tokens
// with its key.
type Google struct{ *jwttest.Issuer }

// NewGoogle starts a JWKS server with one fresh RSA key. Close it when done.
func NewGoogle() (*Google, error) {
	i, err := jwttest.Start("gcetest", func(i *jwttest.Issuer) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/oauth2/v3/certs" {
				http.NotFound(w, r)
				return
			}
			i.ServeJWKS(w)
		})
	})
	if err != nil {
		return nil, err
	}
	return &Google{Issuer: i}, nil
}

// JWKSURL is the JWKS endpoint's URL.
func (g *Google) JWKSURL() string { return g.URL() + "/oauth2/v3/certs" }

// Instance is a Compute Engine instance.
type Instance struct {
	ProjectID      string
	ProjectNumber  int64
	Zone           string
	InstanceID     string
	InstanceName   string
	ServiceAccount string
	// IP is the first network interface's address.
	IP string
	// Created is the instance's creation time. Default: an hour before the
	// token is issued.
	Created time.Time
}

// DefaultInstance is an instance of project embark-test.
func DefaultInstance() Instance {
	return Instance{
		ProjectID: "embark-test", ProjectNumber: 123456789012, Zone: "us-central1-a",
		InstanceID: "5180367924151823417", InstanceName: "ratings-1",
		ServiceAccount: "ratings@embark-test.iam.gserviceaccount.com", IP: "10.128.0.7",
	}
}

// Claims are the claims of a format=full token for audience issued at iat,
// valid for an hour, as Google writes them.
func (in Instance) Claims(audience string, iat time.Time) map[string]any {
	created := in.Created
	if created.IsZero() {
		created = iat.Add(-time.Hour)
	}
	return map[string]any{
		"iss": "https://accounts.google.com", "aud": audience, "azp": "117440386452195335823",
		"sub": "117440386452195335823", "email": in.ServiceAccount, "email_verified": true,
		"iat": iat.Unix(), "exp": iat.Add(time.Hour).Unix(),
		"google": map[string]any{"compute_engine": map[string]any{
			"project_id": in.ProjectID, "project_number": in.ProjectNumber, "zone": in.Zone,
			"instance_id": in.InstanceID, "instance_name": in.InstanceName,
			"instance_creation_timestamp": created.Unix(),
		}},
	}
}

// Token is a token Google issues to in for audience at iat.
func (g *Google) Token(in Instance, audience string, iat time.Time) (string, error) {
	return g.Sign(in.Claims(audience, iat))
}

// MetadataServer is an instance's metadata server: it answers
// /computeMetadata/v1/instance/service-accounts/default/identity (with
// Metadata-Flavor: Google, an audience and format=full) with a fresh token
// Google signs, like Compute Engine's, and instance/zone and
// instance/network-interfaces/0/ip.
type MetadataServer struct {
	srv      *httptest.Server
	google   *Google
	instance Instance
	now      func() time.Time
	mu       sync.Mutex
	issued   int
}

// NewMetadataServer starts a metadata server of in. Close it when done.
func NewMetadataServer(g *Google, in Instance) *MetadataServer {
	m := &MetadataServer{google: g, instance: in, now: time.Now}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	return m
}

// URL is the server's base URL (in place of http://metadata.google.internal).
func (m *MetadataServer) URL() string { return m.srv.URL }

// Issued is how many tokens the server issued.
func (m *MetadataServer) Issued() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.issued
}

// Close stops the server.
func (m *MetadataServer) Close() { m.srv.Close() }

func (m *MetadataServer) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Metadata-Flavor", "Google")
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	switch r.URL.Path {
	case "/computeMetadata/v1/instance/service-accounts/default/identity":
	case "/computeMetadata/v1/instance/zone":
		_, _ = fmt.Fprintf(w, "projects/%d/zones/%s", m.instance.ProjectNumber, m.instance.Zone)
		return
	case "/computeMetadata/v1/instance/network-interfaces/0/ip":
		_, _ = w.Write([]byte(m.instance.IP))
		return
	default:
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	aud := q.Get("audience")
	if aud == "" {
		http.Error(w, "non-empty audience parameter required", http.StatusBadRequest)
		return
	}
	claims := m.instance.Claims(aud, m.now())
	if q.Get("format") != "full" {
		delete(claims, "google")
	}
	// RS256 signatures are deterministic, so two tokens of one second would
	// be identical; a counter in azp makes every token this fake issues
	// distinct, so that an agent's repeated authorizations are not refused
	// as replays.
	m.mu.Lock()
	m.issued++
	n := m.issued
	m.mu.Unlock()
	claims["azp"] = fmt.Sprintf("%s-%d", strings.TrimSpace(fmt.Sprint(claims["azp"])), n)
	tok, err := m.google.Sign(claims)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html")
	_, _ = w.Write([]byte(tok))
}
