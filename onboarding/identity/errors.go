package identity

import (
	"errors"
	"fmt"

	"github.com/embark-mesh/embark/onboarding/refusal"
)

// Reason names why a credential was refused. Every Reason is also an error
// value, so callers can test a refusal with errors.Is(err, ReasonExpired).
type Reason string

// The reasons a verifier refuses a credential. docs/identity.md says what an
// operator should do about each.
const (
	// ReasonMalformed: the credential cannot be parsed (bad JSON, bad base64,
	// bad DER, a token that is not a compact JWS, a missing required field).
	ReasonMalformed Reason = "Malformed"
	// ReasonBadSignature: the signature does not verify with the trusted key
	// (forged, altered, truncated, or signed by a key other than the trusted
	// one, including a certificate embedded in the PKCS#7 envelope).
	ReasonBadSignature Reason = "BadSignature"
	// ReasonUnknownRegion: the document names a region for which no AWS
	// certificate is configured.
	ReasonUnknownRegion Reason = "UnknownRegion"
	// ReasonContentMismatch: the content signed by the PKCS#7 signature is
	// not the submitted document byte for byte.
	ReasonContentMismatch Reason = "ContentMismatch"
	// ReasonSTSRequestInvalid: the signed STS request is not a plain signed
	// POST of sts:GetCallerIdentity to the configured STS endpoint.
	ReasonSTSRequestInvalid Reason = "STSRequestInvalid"
	// ReasonSTSUnbound: the signed STS request does not carry this onboarding
	// plane's audience in a signed header.
	ReasonSTSUnbound Reason = "STSUnbound"
	// ReasonSTSStale: the signed STS request's X-Amz-Date is older than the
	// freshness window or in the future beyond the allowed clock skew.
	ReasonSTSStale Reason = "STSStale"
	// ReasonSTSReplayed: this exact signed STS request was already used.
	ReasonSTSReplayed Reason = "STSReplayed"
	// ReasonSTSRejected: STS refused the signed request (bad signature,
	// expired or revoked credentials, ...).
	ReasonSTSRejected Reason = "STSRejected"
	// ReasonSTSUnavailable: STS could not be reached or answered with
	// something that is not a GetCallerIdentity answer.
	ReasonSTSUnavailable Reason = "STSUnavailable"
	// ReasonNotAssumedRole: STS answered with a caller that is not an
	// assumed-role session (an IAM user, a federated user, the root user).
	ReasonNotAssumedRole Reason = "NotAssumedRole"
	// ReasonPartitionMismatch: the STS caller is in another AWS partition
	// than the document.
	ReasonPartitionMismatch Reason = "PartitionMismatch"
	// ReasonAccountMismatch: the STS caller is in another AWS account than
	// the document.
	ReasonAccountMismatch Reason = "AccountMismatch"
	// ReasonInstanceMismatch: the STS caller's role session is not the
	// document's instance.
	ReasonInstanceMismatch Reason = "InstanceMismatch"
	// ReasonRoleMismatch: the proven IAM role is not one the policy allows.
	ReasonRoleMismatch Reason = "RoleMismatch"
	// ReasonSTSProofRequired: the policy names IAM roles but the credential
	// carried no STS proof of the instance's role.
	ReasonSTSProofRequired Reason = "STSProofRequired"
	// ReasonDocumentReused: the document is already bound to a live
	// registration and is presented from another address without a fresh
	// STS proof.
	ReasonDocumentReused Reason = "DocumentReused"
	// ReasonUnknownIssuer: the token's issuer is not configured.
	ReasonUnknownIssuer Reason = "UnknownIssuer"
	// ReasonExpired: the token's exp is in the past (beyond the leeway).
	ReasonExpired Reason = "Expired"
	// ReasonNotYetValid: the token's nbf or iat is in the future (beyond the
	// leeway).
	ReasonNotYetValid Reason = "NotYetValid"
	// ReasonWrongAudience: the token is not addressed to any configured
	// audience of its issuer.
	ReasonWrongAudience Reason = "WrongAudience"
	// ReasonUnknownKey: no key of the issuer's key set matches the token's key
	// ID, even after a refresh of the key set.
	ReasonUnknownKey Reason = "UnknownKey"
	// ReasonDisallowedAlgorithm: the token's alg is none, an HMAC algorithm,
	// or anything but RS256/384/512, PS256/384/512, ES256/384/512 and EdDSA.
	ReasonDisallowedAlgorithm Reason = "DisallowedAlgorithm"
	// ReasonKeySetUnavailable: the issuer's JWKS could not be fetched and no
	// cached copy exists.
	ReasonKeySetUnavailable Reason = "KeySetUnavailable"
	// ReasonReplayed: a token with this issuer and jti was already used
	// within its lifetime; every onboarding needs a freshly issued token.
	ReasonReplayed Reason = "Replayed"
	// ReasonLifetimeTooLong: the token's lifetime (exp minus iat, else nbf,
	// else now) exceeds the issuer's configured maximum.
	ReasonLifetimeTooLong Reason = "LifetimeTooLong"
	// ReasonWrongSubject: the token's sub does not start with the issuer's
	// configured subjectPrefix.
	ReasonWrongSubject Reason = "WrongSubject"
	// ReasonTaskMismatch: the ECS task claimed is not the task role session
	// STS answered with (another task ID, account or partition), or the ECS
	// API reports it otherwise (another cluster, role, zone or address).
	ReasonTaskMismatch Reason = "TaskMismatch"
	// ReasonTaskNotRunning: the ECS API does not know the claimed task or
	// reports it not RUNNING.
	ReasonTaskNotRunning Reason = "TaskNotRunning"
	// ReasonTaskCheckUnavailable: the ECS API could not be asked about the
	// task (unreachable, throttled, over the endpoint's rate limit).
	ReasonTaskCheckUnavailable Reason = "TaskCheckUnavailable"
	// ReasonInstanceNotRunning: the Compute API does not know the GCE
	// instance the token names, or reports it not RUNNING.
	ReasonInstanceNotRunning Reason = "InstanceNotRunning"
	// ReasonInstanceReplaced: the Compute API reports another numeric ID
	// for the GCE instance's name: the instance the token was issued to was
	// deleted and another created under its name.
	ReasonInstanceReplaced Reason = "InstanceReplaced"
	// ReasonInstanceNoAddress: the Compute API reports no network interface
	// with an internal address for the GCE instance.
	ReasonInstanceNoAddress Reason = "InstanceNoAddress"
	// ReasonInstanceCheckUnavailable: the Compute API could not be asked
	// about the GCE instance (unreachable, failing, permission denied, over
	// the endpoint's rate limit).
	ReasonInstanceCheckUnavailable Reason = "InstanceCheckUnavailable"
	// ReasonVMNotFound: Azure Resource Manager does not know the Azure VM
	// the token names, or reports it not provisioned (Succeeded).
	ReasonVMNotFound Reason = "VMNotFound"
	// ReasonVMMismatch: Azure Resource Manager reports the VM with another
	// system-assigned identity than the token's (a VM created again under
	// the name), or without a primary network interface address.
	ReasonVMMismatch Reason = "VMMismatch"
	// ReasonVMCheckUnavailable: Azure Resource Manager could not be asked
	// about the VM (unreachable, throttled, refusing the endpoint's own
	// token, over the endpoint's rate limit).
	ReasonVMCheckUnavailable Reason = "VMCheckUnavailable"
)

// Reasons lists every Reason, in the order of the constants above.
func Reasons() []Reason {
	return []Reason{
		ReasonMalformed, ReasonBadSignature, ReasonUnknownRegion, ReasonContentMismatch,
		ReasonSTSRequestInvalid, ReasonSTSUnbound, ReasonSTSStale, ReasonSTSReplayed,
		ReasonSTSRejected, ReasonSTSUnavailable, ReasonNotAssumedRole, ReasonPartitionMismatch,
		ReasonAccountMismatch, ReasonInstanceMismatch, ReasonRoleMismatch, ReasonSTSProofRequired,
		ReasonDocumentReused, ReasonUnknownIssuer, ReasonExpired, ReasonNotYetValid,
		ReasonWrongAudience, ReasonUnknownKey, ReasonDisallowedAlgorithm, ReasonKeySetUnavailable,
		ReasonReplayed, ReasonLifetimeTooLong, ReasonWrongSubject,
		ReasonTaskMismatch, ReasonTaskNotRunning, ReasonTaskCheckUnavailable,
		ReasonInstanceNotRunning, ReasonInstanceReplaced, ReasonInstanceNoAddress, ReasonInstanceCheckUnavailable,
		ReasonVMNotFound, ReasonVMMismatch, ReasonVMCheckUnavailable,
	}
}

// Error makes a Reason usable as a sentinel error.
func (r Reason) Error() string { return string(r) }

// VerificationError is the error every verifier returns when it refuses a
// credential. Reason says what failed, Detail says it for an operator, Err is
// the underlying cause if there is one.
type VerificationError struct {
	Reason Reason
	Detail string
	Err    error
}

var _ error = (*VerificationError)(nil)

// Error formats the refusal as "<Reason>: <detail>: <cause>".
func (e *VerificationError) Error() string { return refusal.Message(e.Reason, e.Detail, e.Err) }

// Unwrap exposes both the Reason (for errors.Is) and the cause.
func (e *VerificationError) Unwrap() []error { return refusal.Unwrap(e.Reason, e.Err) }

// Refuse returns a *VerificationError with the given reason and a detail
// formatted like fmt.Sprintf. It does not wrap a cause; use [RefuseWrap] for
// that.
func Refuse(reason Reason, format string, args ...any) *VerificationError {
	return &VerificationError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// RefuseWrap is [Refuse] with an underlying cause kept for errors.Is/As.
func RefuseWrap(reason Reason, cause error, format string, args ...any) *VerificationError {
	return &VerificationError{Reason: reason, Detail: fmt.Sprintf(format, args...), Err: cause}
}

// ReasonOf returns the Reason of the first *VerificationError in err's chain,
// or "" if there is none.
func ReasonOf(err error) Reason {
	var ve *VerificationError
	if errors.As(err, &ve) {
		return ve.Reason
	}
	return ""
}
