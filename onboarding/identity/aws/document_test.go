package aws_test

import (
	"strings"
	"testing"

	"github.com/embark-mesh/embark/onboarding/identity"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
)

func TestParseDocument(t *testing.T) {
	valid := string(awstest.Instance{}.Document())
	tests := []struct {
		name       string
		doc        string
		wantReason identity.Reason
		wantZone   string
	}{
		{name: "fake IMDS document", doc: valid, wantZone: "us-east-2b"},
		{name: "compact JSON", doc: `{"accountId":"123456789012","instanceId":"i-0123456789abcdef0","region":"eu-west-1","availabilityZone":"eu-west-1a"}`, wantZone: "eu-west-1a"},
		{name: "short instance id", doc: `{"accountId":"123456789012","instanceId":"i-01234567","region":"eu-west-1","availabilityZone":"eu-west-1a"}`, wantZone: "eu-west-1a"},
		{name: "local zone", doc: `{"accountId":"123456789012","instanceId":"i-01234567","region":"us-west-2","availabilityZone":"us-west-2-lax-1a"}`, wantZone: "us-west-2-lax-1a"},
		{name: "empty", doc: "", wantReason: identity.ReasonMalformed},
		{name: "not JSON", doc: "accountId=1", wantReason: identity.ReasonMalformed},
		{name: "JSON array", doc: "[]", wantReason: identity.ReasonMalformed},
		{name: "JSON null", doc: "null", wantReason: identity.ReasonMalformed},
		{name: "account not a string", doc: strings.Replace(valid, `"123456789012"`, `123456789012`, 1), wantReason: identity.ReasonMalformed},
		{name: "short account", doc: strings.Replace(valid, `"123456789012"`, `"12345"`, 1), wantReason: identity.ReasonMalformed},
		{name: "bad instance id", doc: strings.Replace(valid, `"i-1234567890abcdef0"`, `"i-XYZ/../x"`, 1), wantReason: identity.ReasonMalformed},
		{name: "upper-case instance id", doc: strings.Replace(valid, `"i-1234567890abcdef0"`, `"i-1234567890ABCDEF0"`, 1), wantReason: identity.ReasonMalformed},
		{name: "bad region", doc: strings.Replace(valid, `"region" : "us-east-2"`, `"region" : "Mars"`, 1), wantReason: identity.ReasonMalformed},
		{name: "zone of another region", doc: strings.Replace(valid, `"us-east-2b"`, `"us-west-2b"`, 1), wantReason: identity.ReasonMalformed},
		{name: "zone with bad characters", doc: strings.Replace(valid, `"us-east-2b"`, `"us-east-2B_"`, 1), wantReason: identity.ReasonMalformed},
		{name: "zone equals region", doc: strings.Replace(valid, `"us-east-2b"`, `"us-east-2"`, 1), wantReason: identity.ReasonMalformed},
		{name: "too large", doc: valid + strings.Repeat(" ", awsid.MaxDocumentSize), wantReason: identity.ReasonMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc, err := awsid.ParseDocument([]byte(tt.doc))
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("ParseDocument() error = %v, want reason %q", err, tt.wantReason)
			}
			if err == nil && doc.AvailabilityZone != tt.wantZone {
				t.Errorf("zone %q, want %q", doc.AvailabilityZone, tt.wantZone)
			}
		})
	}
}

func TestParseAssumedRoleARN(t *testing.T) {
	tests := []struct {
		name       string
		arn        string
		want       awsid.AssumedRoleARN
		wantReason identity.Reason
	}{
		{
			name: "instance profile session",
			arn:  "arn:aws:sts::123456789012:assumed-role/ratings-role/i-1234567890abcdef0",
			want: awsid.AssumedRoleARN{Partition: "aws", Account: "123456789012", RoleName: "ratings-role", SessionName: "i-1234567890abcdef0"},
		},
		{
			name: "china partition",
			arn:  "arn:aws-cn:sts::123456789012:assumed-role/r/i-1",
			want: awsid.AssumedRoleARN{Partition: "aws-cn", Account: "123456789012", RoleName: "r", SessionName: "i-1"},
		},
		{name: "IAM user", arn: "arn:aws:iam::123456789012:user/alice", wantReason: identity.ReasonNotAssumedRole},
		{name: "root", arn: "arn:aws:iam::123456789012:root", wantReason: identity.ReasonNotAssumedRole},
		{name: "federated user", arn: "arn:aws:sts::123456789012:federated-user/bob", wantReason: identity.ReasonNotAssumedRole},
		{name: "no session", arn: "arn:aws:sts::123456789012:assumed-role/r", wantReason: identity.ReasonNotAssumedRole},
		{name: "extra path", arn: "arn:aws:sts::123456789012:assumed-role/r/i-1/x", wantReason: identity.ReasonNotAssumedRole},
		{name: "region set", arn: "arn:aws:sts:us-east-1:123456789012:assumed-role/r/i-1", wantReason: identity.ReasonNotAssumedRole},
		{name: "bad account", arn: "arn:aws:sts::1234:assumed-role/r/i-1", wantReason: identity.ReasonNotAssumedRole},
		{name: "not an ARN", arn: "hello", wantReason: identity.ReasonNotAssumedRole},
		{name: "empty", arn: "", wantReason: identity.ReasonNotAssumedRole},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := awsid.ParseAssumedRoleARN(tt.arn)
			if r := identity.ReasonOf(err); r != tt.wantReason {
				t.Fatalf("ParseAssumedRoleARN() error = %v, want reason %q", err, tt.wantReason)
			}
			if err == nil && *got != tt.want {
				t.Errorf("ParseAssumedRoleARN() = %+v, want %+v", *got, tt.want)
			}
		})
	}
}

func TestReuseDecision(t *testing.T) {
	tests := []struct {
		name       string
		bound      []string
		request    string
		freshSTS   bool
		wantReason identity.Reason
	}{
		{name: "same address", bound: []string{"172.31.5.254"}, request: "172.31.5.254"},
		{name: "same address with port", bound: []string{"172.31.5.254"}, request: "172.31.5.254:40123"},
		{name: "one of several", bound: []string{"54.1.2.3", "172.31.5.254"}, request: "172.31.5.254"},
		{name: "IPv4-mapped IPv6", bound: []string{"172.31.5.254"}, request: "[::ffff:172.31.5.254]:443"},
		{name: "IPv6", bound: []string{"2001:db8::1"}, request: "[2001:db8::1]:1234"},
		{name: "other address with fresh STS proof", bound: []string{"172.31.5.254"}, request: "10.0.0.9", freshSTS: true},
		{name: "other address without STS proof", bound: []string{"172.31.5.254"}, request: "10.0.0.9", wantReason: identity.ReasonDocumentReused},
		{name: "no bound addresses", bound: nil, request: "10.0.0.9", wantReason: identity.ReasonDocumentReused},
		{name: "unparseable request address", bound: []string{"172.31.5.254"}, request: "somewhere", wantReason: identity.ReasonDocumentReused},
		{name: "unparseable bound address ignored", bound: []string{"somewhere"}, request: "10.0.0.9", wantReason: identity.ReasonDocumentReused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := awsid.ReuseDecision(tt.bound, tt.request, tt.freshSTS)
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("ReuseDecision() = %v, want reason %q", err, tt.wantReason)
			}
		})
	}
}
