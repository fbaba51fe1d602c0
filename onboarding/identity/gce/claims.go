package gce

import (
	"regexp"
	"strconv"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
)

// Formats of the claims, as Compute Engine defines them.
var (
	projectIDRE     = regexp.MustCompile(`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`)
	projectNumberRE = regexp.MustCompile(`^[0-9]{1,20}$`)
	zoneRE          = regexp.MustCompile(`^[a-z]+-[a-z]+[0-9]+-[a-z]$`)
	instanceIDRE    = regexp.MustCompile(`^[0-9]{1,20}$`)
	instanceNameRE  = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	emailRE         = regexp.MustCompile(`^[a-z0-9][-a-z0-9._+]{0,127}@[a-z0-9][-a-z0-9.]{0,252}$`)
)

// parseIdentity reads the instance identity from a verified token's claims
// (attrs, by the names of claimPaths): every google.compute_engine claim
// must be present and well-formed, iat set, and the service account email
// verified.
func parseIdentity(attrs map[string]string) (*identity.GCEIdentity, error) {
	for _, c := range []struct {
		name string
		re   *regexp.Regexp
	}{
		{attrProjectID, projectIDRE}, {attrProjectNumber, projectNumberRE}, {attrZone, zoneRE},
		{attrInstanceID, instanceIDRE}, {attrInstanceName, instanceNameRE}, {attrCreation, projectNumberRE},
	} {
		v, ok := attrs[c.name]
		if !ok {
			return nil, identity.Refuse(identity.ReasonMalformed, "token has no google.compute_engine.%s claim: the agent must request the token with format=full", c.name)
		}
		if !c.re.MatchString(v) {
			return nil, identity.Refuse(identity.ReasonMalformed, "token claim google.compute_engine.%s %q is not a valid value", c.name, clip(v))
		}
	}
	// Google always sets iat; without it the token's lifetime could only be
	// counted from now.
	if !instanceIDRE.MatchString(attrs[attrIssuedAt]) {
		return nil, identity.Refuse(identity.ReasonMalformed, "token has no iat (issued-at) as a number of seconds")
	}
	email := attrs[attrEmail]
	if !emailRE.MatchString(email) {
		return nil, identity.Refuse(identity.ReasonMalformed, "token claim email %q is not a service account email: the instance must run as a service account", clip(email))
	}
	if attrs[attrEmailVerified] != "true" {
		return nil, identity.Refuse(identity.ReasonMalformed, "token claim email_verified is %q, want true", clip(attrs[attrEmailVerified]))
	}
	created, err := strconv.ParseInt(attrs[attrCreation], 10, 64)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "token claim google.compute_engine.instance_creation_timestamp")
	}
	return &identity.GCEIdentity{
		ProjectID: attrs[attrProjectID], ProjectNumber: attrs[attrProjectNumber], Zone: attrs[attrZone],
		InstanceID: attrs[attrInstanceID], InstanceName: attrs[attrInstanceName],
		InstanceCreation: time.Unix(created, 0).UTC(), ServiceAccount: email,
	}, nil
}

func clip(s string) string {
	if len(s) <= 100 {
		return s
	}
	return s[:100] + "..."
}
