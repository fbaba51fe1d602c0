// Package boundtoken reads the claims of a Kubernetes service-account token
// bound to an object (the sidecar token Embark requests bound to a
// registration's credential Secret): its jti, expiry, namespace, service
// account and the object it is bound to.
package boundtoken

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

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
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return nil, errors.New("not a JWS compact serialization")
	}
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
