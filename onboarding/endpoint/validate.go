package endpoint

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// Size limits of request fields. gRPC already bounds a message (4 MiB by
// default); these keep every field to what a genuine agent sends.
const (
	maxDocumentBytes  = 16 << 10
	maxSignatureBytes = 8 << 10
	maxJWTBytes       = 16 << 10
	maxSTSHeaders     = 32
	maxSTSBodyBytes   = 4 << 10
	maxSTSURLBytes    = 2 << 10
	maxHeaderBytes    = 8 << 10
	maxAddresses      = 16
	maxLabels         = 64
	maxVersionBytes   = 128
	maxErrorMsgBytes  = 256
)

// agentErrorReason is the form of RegisterRequest.last_error.reason: a
// word, as the agent's reasons (PlatformCredential, BootstrapWrite) and gRPC
// code names are.
var agentErrorReason = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,63}$`)

// ValidateAuthorizeRequest checks the shape of an AuthorizeRequest before
// anything is verified. Its error message names the field.
func ValidateAuthorizeRequest(req *onboardingv1alpha1.AuthorizeRequest) error {
	g := req.GetWorkloadGroup()
	if g == nil {
		return errors.New("workload_group: required")
	}
	if msgs := validation.IsDNS1123Label(g.GetNamespace()); len(msgs) > 0 {
		return fmt.Errorf("workload_group.namespace %q: %s", clip(g.GetNamespace()), msgs[0])
	}
	if msgs := validation.IsDNS1123Subdomain(g.GetName()); len(msgs) > 0 {
		return fmt.Errorf("workload_group.name %q: %s", clip(g.GetName()), msgs[0])
	}
	switch c := req.GetCredential().(type) {
	case *onboardingv1alpha1.AuthorizeRequest_Aws:
		a := c.Aws
		if a == nil {
			return errors.New("aws: required")
		}
		if n := len(a.GetInstanceIdentityDocument()); n == 0 || n > maxDocumentBytes {
			return fmt.Errorf("aws.instance_identity_document: %d bytes, want 1 to %d", n, maxDocumentBytes)
		}
		if n := len(a.GetRsa2048Signature()); n == 0 || n > maxSignatureBytes {
			return fmt.Errorf("aws.rsa2048_signature: %d bytes, want 1 to %d", n, maxSignatureBytes)
		}
		if r := a.GetStsGetCallerIdentity(); r != nil {
			if err := validateSignedRequest("aws.sts_get_caller_identity", r); err != nil {
				return err
			}
		}
	case *onboardingv1alpha1.AuthorizeRequest_Jwt:
		if n := len(c.Jwt.GetToken()); n == 0 || n > maxJWTBytes {
			return fmt.Errorf("jwt.token: %d bytes, want 1 to %d", n, maxJWTBytes)
		}
	case *onboardingv1alpha1.AuthorizeRequest_Gce:
		if n := len(c.Gce.GetToken()); n == 0 || n > maxJWTBytes {
			return fmt.Errorf("gce.token: %d bytes, want 1 to %d", n, maxJWTBytes)
		}
	case *onboardingv1alpha1.AuthorizeRequest_Azure:
		if n := len(c.Azure.GetToken()); n == 0 || n > maxJWTBytes {
			return fmt.Errorf("azure.token: %d bytes, want 1 to %d", n, maxJWTBytes)
		}
	case *onboardingv1alpha1.AuthorizeRequest_Ecs:
		return validateECS(c.Ecs)
	default:
		return errors.New("credential: one of aws, jwt, gce, azure or ecs is required")
	}
	return nil
}

// validateECS checks the shape of an ECS credential; the verifier checks
// what it claims.
func validateECS(e *onboardingv1alpha1.ECSCredential) error {
	r := e.GetStsGetCallerIdentity()
	if r == nil {
		return errors.New("ecs.sts_get_caller_identity: required")
	}
	if err := validateSignedRequest("ecs.sts_get_caller_identity", r); err != nil {
		return err
	}
	for _, f := range []struct {
		name, value string
		max         int
	}{
		{"ecs.cluster", e.GetCluster(), 512}, {"ecs.task_arn", e.GetTaskArn(), 512},
		{"ecs.availability_zone", e.GetAvailabilityZone(), 48},
	} {
		if n := len(f.value); n == 0 || n > f.max || !utf8.ValidString(f.value) {
			return fmt.Errorf("%s: %d bytes, want 1 to %d of UTF-8", f.name, n, f.max)
		}
	}
	if len(e.GetFamily()) > 255 || len(e.GetRevision()) > 16 || len(e.GetAddress()) > 64 {
		return errors.New("ecs.family, ecs.revision or ecs.address: too long")
	}
	return nil
}

// validateSignedRequest checks the shape of a signed sts:GetCallerIdentity
// request; field names the request's field in errors.
func validateSignedRequest(field string, r *onboardingv1alpha1.SignedHTTPRequest) error {
	if r.GetMethod() != "POST" {
		return fmt.Errorf("%s.method %q: want POST", field, clip(r.GetMethod()))
	}
	if len(r.GetUrl()) > maxSTSURLBytes {
		return fmt.Errorf("%s.url: longer than %d bytes", field, maxSTSURLBytes)
	}
	if u, err := url.Parse(r.GetUrl()); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("%s.url %q: want an http(s) URL", field, clip(r.GetUrl()))
	}
	if len(r.GetHeaders()) > maxSTSHeaders {
		return fmt.Errorf("%s.headers: more than %d", field, maxSTSHeaders)
	}
	for i, h := range r.GetHeaders() {
		if h.GetName() == "" || len(h.GetName())+len(h.GetValue()) > maxHeaderBytes {
			return fmt.Errorf("%s.headers[%d]: empty name or longer than %d bytes", field, i, maxHeaderBytes)
		}
	}
	if len(r.GetBody()) > maxSTSBodyBytes {
		return fmt.Errorf("%s.body: longer than %d bytes", field, maxSTSBodyBytes)
	}
	return nil
}

// ValidateRegisterRequest checks the shape of a RegisterRequest; the
// registry validates the meaning of each field.
func ValidateRegisterRequest(req *onboardingv1alpha1.RegisterRequest) error {
	if n := len(req.GetAddresses()); n == 0 || n > maxAddresses {
		return fmt.Errorf("addresses: %d, want 1 to %d", n, maxAddresses)
	}
	if len(req.GetLabels()) > maxLabels {
		return fmt.Errorf("labels: more than %d", maxLabels)
	}
	for _, f := range []struct{ name, value string }{{"agent_version", req.GetAgentVersion()}, {"istio_sidecar_version", req.GetIstioSidecarVersion()}} {
		if len(f.value) > maxVersionBytes || !utf8.ValidString(f.value) {
			return fmt.Errorf("%s: longer than %d bytes or not UTF-8", f.name, maxVersionBytes)
		}
		// Shown in the registration (kubectl get war -o wide, describe).
		if i := strings.IndexFunc(f.value, unprintable); i >= 0 {
			return fmt.Errorf("%s: control character %U at byte %d", f.name, []rune(f.value[i:])[0], i)
		}
	}
	return validateAgentError(req.GetLastError())
}

// validateAgentError checks the agent's report of its last onboarding
// error, which is shown in the registration's status (kubectl get and
// describe) and so must not carry what a terminal interprets.
func validateAgentError(e *onboardingv1alpha1.AgentError) error {
	if e == nil {
		return nil
	}
	if !agentErrorReason.MatchString(e.GetReason()) {
		return fmt.Errorf("last_error.reason %q: want a word matching %s", clip(e.GetReason()), agentErrorReason)
	}
	m := e.GetMessage()
	if len(m) > maxErrorMsgBytes {
		return fmt.Errorf("last_error.message: %d bytes, want at most %d", len(m), maxErrorMsgBytes)
	}
	if !utf8.ValidString(m) {
		return errors.New("last_error.message: not UTF-8")
	}
	if i := strings.IndexFunc(m, unprintable); i >= 0 {
		return fmt.Errorf("last_error.message: control character %U at byte %d", []rune(m[i:])[0], i)
	}
	return nil
}

// unprintable reports whether r is a control character or one that changes
// how the text around it is shown (bidirectional overrides, line and
// paragraph separators).
func unprintable(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// clip bounds untrusted text quoted in an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
