// Package jwttest is a loopback token issuer for tests: a TLS server
// publishing a JWKS of one RSA key, which signs tokens (RS256, with its
// kid) as a cloud's identity provider does, can be rotated, and counts how
// often the JWKS is fetched. gcetest (Google) and azuretest (Microsoft
// Entra ID) are issuers of this kind with their own routes.
package jwttest

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Issuer serves a JWKS over TLS and signs tokens with its key.
type Issuer struct {
	srv       *httptest.Server
	kidPrefix string
	mu        sync.Mutex
	key       *rsa.PrivateKey
	kid       string
	// fetches counts JWKS requests.
	fetches int
}

// Start starts an issuer with one fresh RSA key, its kid starting with
// kidPrefix, answering requests with routes, which serves the keys with
// ServeJWKS. Close it when done.
func Start(kidPrefix string, routes func(*Issuer) http.Handler) (*Issuer, error) {
	i := &Issuer{kidPrefix: kidPrefix}
	if err := i.RotateKey(); err != nil {
		return nil, err
	}
	i.srv = httptest.NewTLSServer(routes(i))
	return i, nil
}

// NewKey returns a key of a signer the issuer does not publish, for
// forgeries.
func NewKey() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 2048) }

// RotateKey replaces the signing key (and the published JWKS) with a new one.
func (i *Issuer) RotateKey() error {
	k, err := NewKey()
	if err != nil {
		return err
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	i.key, i.kid = k, fmt.Sprintf("%s-%d", i.kidPrefix, time.Now().UnixNano())
	return nil
}

// ServeJWKS answers with the JWKS of the issuer's key and counts the fetch.
func (i *Issuer) ServeJWKS(w http.ResponseWriter) {
	i.mu.Lock()
	i.fetches++
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &i.key.PublicKey, KeyID: i.kid, Algorithm: string(jose.RS256), Use: "sig"}}}
	i.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(set)
}

// URL is the server's base URL (https).
func (i *Issuer) URL() string { return i.srv.URL }

// CACertificates is the PEM of the root the server is served with.
func (i *Issuer) CACertificates() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: i.srv.Certificate().Raw})
}

// Fetches is how many times the JWKS was fetched.
func (i *Issuer) Fetches() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.fetches
}

// Close stops the server.
func (i *Issuer) Close() { i.srv.Close() }

// Sign signs claims (any JSON object): RS256 with the published key and
// its kid.
func (i *Issuer) Sign(claims any) (string, error) {
	i.mu.Lock()
	k, kid := i.key, i.kid
	i.mu.Unlock()
	return SignWith(k, kid, claims)
}

// SignWith signs claims with key under kid.
func SignWith(key *rsa.PrivateKey, kid string, claims any) (string, error) {
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		return "", err
	}
	obj, err := s.Sign(payload)
	if err != nil {
		return "", err
	}
	return obj.CompactSerialize()
}

// KeyID is the kid of the published key.
func (i *Issuer) KeyID() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.kid
}
