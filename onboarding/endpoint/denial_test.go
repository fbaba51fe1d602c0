package endpoint

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
)

var genericDenial = regexp.MustCompile(`^not authorized to onboard \(request id [0-9a-f]{16}\)$`)

// A policy denial and a WorkloadGroup that does not exist get the same
// answer, PermissionDenied with a request ID only, unless the caller's
// source is one of DetailedDenialSources; the denial is counted by reason
// either way.
func TestDenialAnswers(t *testing.T) {
	tests := []struct {
		name     string
		sources  []netip.Prefix
		group    string
		instance awstest.Instance
		wantCode codes.Code
		// wantMsg matches the whole message when generic, else is part of it.
		wantMsg    string
		wantReason string
	}{
		{name: "default: account no policy allows", group: "ratings",
			instance: awstest.Instance{Account: "999999999999", InstanceID: "i-0ccccccccccccccc1"}, wantCode: codes.PermissionDenied, wantReason: "PolicyDenied"},
		{name: "default: WorkloadGroup that does not exist", group: "no-such-group",
			instance: awstest.Instance{InstanceID: "i-0ccccccccccccccc2"}, wantCode: codes.PermissionDenied, wantReason: "WorkloadGroupNotFound"},
		{name: "other trusted sources: still generic", sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, group: "no-such-group",
			instance: awstest.Instance{InstanceID: "i-0ccccccccccccccc3"}, wantCode: codes.PermissionDenied, wantReason: "WorkloadGroupNotFound"},
		{name: "trusted source: the closest rule", sources: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, group: "ratings",
			instance: awstest.Instance{Account: "999999999999", InstanceID: "i-0ccccccccccccccc4"}, wantCode: codes.PermissionDenied,
			wantMsg: "account 999999999999 not in [123456789012 234567890123]", wantReason: "PolicyDenied"},
		{name: "trusted source: the missing group", sources: []netip.Prefix{netip.MustParsePrefix("::/0"), netip.MustParsePrefix("0.0.0.0/0")}, group: "no-such-group",
			instance: awstest.Instance{InstanceID: "i-0ccccccccccccccc5"}, wantCode: codes.FailedPrecondition,
			wantMsg: "WorkloadGroup not found: ", wantReason: "WorkloadGroupNotFound"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, func(o *Options) { o.DetailedDenialSources, o.Metrics = tt.sources, m })
			h.apply(widePolicy)
			h.group("ratings", map[string]string{"app": "ratings"})
			_, err = h.authorize(tt.group, h.instance(tt.instance))
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("code %v (%v), want %v", got, err, tt.wantCode)
			}
			msg := status.Convert(err).Message()
			if tt.wantMsg == "" && !genericDenial.MatchString(msg) {
				t.Errorf("answer %q, want %q", msg, "not authorized to onboard (request id <16 hex digits>)")
			}
			if tt.wantMsg != "" && (!strings.Contains(msg, tt.wantMsg) || !strings.Contains(msg, "(request id ")) {
				t.Errorf("answer %q, want it to say %q and the request id", msg, tt.wantMsg)
			}
			if got := testutil.ToFloat64(m.denials.WithLabelValues("authorize", tt.wantReason)); got != 1 {
				t.Errorf("denials_total{stage=authorize,reason=%s} = %v, want 1", tt.wantReason, got)
			}
		})
	}
}

// Without the instance profile check (the default), an STS proof is
// neither sent to STS nor counted: an EC2 identity carries no IAM role,
// so a policy naming iamRoleNames admits none, and one that does not
// name roles admits the instance without a role.
func TestSTSProofUnusedWithoutInstanceProfileCheck(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.InstanceProfiles = nil })
	h.apply(narrowPolicy)
	h.group("ratings", map[string]string{"app": "ratings"})
	h.group("details", map[string]string{"app": "details"})
	m := h.instance(awstest.Instance{Role: "ratings-role", InstanceID: "i-0ccccccccccccccc6"})
	if h.credential(m).Aws.GetStsGetCallerIdentity() == nil {
		t.Fatal("the credential carries no STS proof")
	}
	before := h.aws.STS.Calls()
	_, err := h.authorize("ratings", m)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "iam role not proven") {
		t.Errorf("policy naming iamRoleNames: %v, want PermissionDenied, iam role not proven", err)
	}
	h.apply(widePolicy)
	resp, err := h.authorize("details", m)
	if err != nil {
		t.Fatalf("policy naming no role: %v", err)
	}
	claims, err := h.tokens.Verify(resp.GetToken())
	if err != nil {
		t.Fatal(err)
	}
	if ec2 := claims.Workload.Verified.AWS.EC2; ec2 == nil || ec2.IAMRole != "" {
		t.Errorf("token identity EC2 %+v, want the instance without an IAM role", ec2)
	}
	if got := h.aws.STS.Calls() - before; got != 0 {
		t.Errorf("STS called %d times, want 0", got)
	}
}
