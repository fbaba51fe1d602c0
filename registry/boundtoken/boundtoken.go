// Package boundtoken reads the claims of a Kubernetes service-account token
// bound to an object (the sidecar token Embark requests bound to a
// registration's credential Secret): its jti, expiry, namespace, service
// account and the object it is bound to.
package boundtoken

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/embark-mesh/embark/internal/compactjws"
	"k8s.io/apimachinery/pkg/types"
)

// Claims are the claims of a Kubernetes service-account token bound to
// an object, as the API server writes them under "kubernetes.io".
type Claims struct {
	// ID is the token's jti (the API server reports it in TokenReview as
	// authentication.kubernetes.io/credential-id "JTI=<id>").
	ID string `json:"jti"`
	// Expiry is the token's exp (seconds since the epoch); 0 if absent.
	Expiry     int64 `json:"exp"`
	Kubernetes struct {
		Namespace      string     `json:"namespace"`
		Secret         *objectRef `json:"secret,omitempty"`
		Pod            *objectRef `json:"pod,omitempty"`
		ServiceAccount objectRef  `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

type objectRef struct {
	Name string    `json:"name"`
	UID  types.UID `json:"uid"`
}

// ExpiresAt returns when the token expires (exp), and false when it has no
// exp.
func (c *Claims) ExpiresAt() (time.Time, bool) {
	if c.Expiry <= 0 {
		return time.Time{}, false
	}
	return time.Unix(c.Expiry, 0), true
}

// SecretRef returns the Secret the token is bound to, if any.
func (c *Claims) SecretRef() (name string, uid types.UID, ok bool) {
	if c.Kubernetes.Secret == nil {
		return "", "", false
	}
	return c.Kubernetes.Secret.Name, c.Kubernetes.Secret.UID, true
}

// Decode reads the claims of a service-account token WITHOUT
// checking its signature. Use it only on a token the API server has just
// accepted in a TokenReview: then the claims are the API server's own.
func Decode(raw string) (*Claims, error) {
	// Strictly the compact shape: Go's base64 skips CR and LF, so without
	// this check another spelling of a token would decode (and pass the API
	// server's review) as the same token under a different cache key.
	if err := compactjws.Check(raw); err != nil {
		return nil, fmt.Errorf("not a JWS compact serialization: %w", err)
	}
	parts := strings.Split(raw, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("decode token payload: %w", err)
	}
	c := &Claims{}
	if err := json.Unmarshal(payload, c); err != nil {
		return nil, fmt.Errorf("decode token claims: %w", err)
	}
	return c, nil
}
