package adversarial

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/policy"
	"github.com/embark-mesh/embark/test/fixtures"
)

// lockedBuffer is a log destination the endpoint's goroutines share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var genericDenial = regexp.MustCompile(`^not authorized to onboard \(request id ([0-9a-f]{16})\)$`)

// Anyone can ask the onboarding endpoint: any AWS account has genuine
// instance identity documents, any holder of a trusted issuer's token a
// genuine JWT. With the default configuration, what a denial tells them is
// one shape, whatever the reason: it names no account, zone, role, subject
// or policy, and a WorkloadGroup that does not exist is answered exactly
// as one that does. The explanation stays with the operator: the log line
// carrying the answer's request ID, and the OnboardingDenied Event.
func TestDenialsDiscloseNoPolicy(t *testing.T) {
	Attack(t, "policy disclosed by denials: read allowed accounts, zones, subjects and group existence from refusals")
	logs := &lockedBuffer{}
	is := newJWTIssuer(t, "corp")
	h := newOnboarding(t, onboardingOptions{issuers: []*jwtIssuer{is}, logger: slog.New(slog.NewTextHandler(logs, nil))})
	h.policy("narrow",
		authorizationv1alpha1.AllowRule{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{
				Accounts: []string{fixtures.Account}, Zones: []string{"us-east-2b"}, EC2: &authorizationv1alpha1.EC2Matcher{}}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
		},
		authorizationv1alpha1.AllowRule{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{JWT: &authorizationv1alpha1.JWTMatcher{Issuer: is.url, Subjects: []string{"host-allowed"}}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
		})
	h.group("ratings")

	stranger := h.instance(awstest.Instance{Account: "999999999999", InstanceID: "i-0aaaaaaaaaaaaab01", Zone: "us-east-2b"})
	wrongZone := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaab02", Zone: "us-east-2a"})
	allowed := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaab03", Zone: "us-east-2b"})
	type try struct {
		name string
		call func() error
	}
	tries := []try{
		{"account no policy allows", func() error { _, err := h.authorizeAWS("ratings", stranger, false); return err }},
		{"zone the policy does not allow", func() error { _, err := h.authorizeAWS("ratings", wrongZone, false); return err }},
		{"subject the policy does not allow", func() error {
			_, err := h.authorizeJWT("ratings", is.mint(t, "host-other", nil))
			return err
		}},
		{"allowed identity, WorkloadGroup that does not exist", func() error { _, err := h.authorizeAWS("no-such-group", allowed, false); return err }},
		{"stranger, WorkloadGroup that does not exist", func() error { _, err := h.authorizeAWS("no-such-group", stranger, false); return err }},
	}
	secrets := []string{fixtures.Account, "999999999999", "us-east-2", "host-allowed", "host-other", is.url, "ratings", "no-such-group",
		"OnboardingPolic", "WorkloadGroup", "zone", "account", "subject", "not found", "rule", h.ns}
	ids := map[string]string{}
	for _, tr := range tries {
		err := tr.call()
		if got := status.Code(err); got != codes.PermissionDenied {
			t.Errorf("%s: code %v (%v), want PermissionDenied", tr.name, got, err)
			continue
		}
		msg := status.Convert(err).Message()
		m := genericDenial.FindStringSubmatch(msg)
		if m == nil {
			t.Errorf("%s: answer %q, want exactly %q", tr.name, msg, "not authorized to onboard (request id <16 hex digits>)")
		}
		for _, s := range secrets {
			if strings.Contains(msg, s) {
				t.Errorf("%s: answer %q discloses %q", tr.name, msg, s)
			}
		}
		if m != nil {
			if prev, dup := ids[m[1]]; dup {
				t.Errorf("%s and %s share request id %s", prev, tr.name, m[1])
			}
			ids[m[1]] = tr.name
		}
	}
	if t.Failed() {
		return
	}
	// The operator still learns why: the log line of each request ID
	// carries the explanation, and the denials of an existing group are
	// Events on it.
	for id, name := range ids {
		line := logLine(logs.String(), "requestID="+id)
		want := map[string]string{
			"account no policy allows":                            "account 999999999999",
			"zone the policy does not allow":                      "zone us-east-2a",
			"subject the policy does not allow":                   "subject host-other",
			"allowed identity, WorkloadGroup that does not exist": "no-such-group",
			"stranger, WorkloadGroup that does not exist":         "no-such-group",
		}[name]
		if !strings.Contains(line, want) {
			t.Errorf("%s: the log line of request id %s (%q) does not say %q", name, id, line, want)
		}
	}
	fixtures.WaitEvent(t, env.Client, h.ns, "ratings", policy.ReasonOnboardingDenied, "account 999999999999")
	fixtures.WaitEvent(t, env.Client, h.ns, "ratings", policy.ReasonOnboardingDenied, "zone us-east-2a not in [us-east-2b]")
}

// logLine returns the line of logs that contains s ("" when none).
func logLine(logs, s string) string {
	for line := range strings.Lines(logs) {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}
