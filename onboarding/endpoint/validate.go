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
			if r.GetMethod() != "POST" {
				return fmt.Errorf("aws.sts_get_caller_identity.method %q: want POST", clip(r.GetMethod()))
			}
			if len(r.GetUrl()) > maxSTSURLBytes {
				return fmt.Errorf("aws.sts_get_caller_identity.url: longer than %d bytes", maxSTSURLBytes)
			}
			if u, err := url.Parse(r.GetUrl()); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				return fmt.Errorf("aws.sts_get_caller_identity.url %q: want an http(s) URL", clip(r.GetUrl()))
			}
			if len(r.GetHeaders()) > maxSTSHeaders {
				return fmt.Errorf("aws.sts_get_caller_identity.headers: more than %d", maxSTSHeaders)
			}
			for i, h := range r.GetHeaders() {
				if h.GetName() == "" || len(h.GetName())+len(h.GetValue()) > maxHeaderBytes {
					return fmt.Errorf("aws.sts_get_caller_identity.headers[%d]: empty name or longer than %d bytes", i, maxHeaderBytes)
				}
			}
			if len(r.GetBody()) > maxSTSBodyBytes {
				return fmt.Errorf("aws.sts_get_caller_identity.body: longer than %d bytes", maxSTSBodyBytes)
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
	default:
		return errors.New("credential: one of aws, jwt, gce or azure is required")
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
