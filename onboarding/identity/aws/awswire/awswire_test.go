package awswire_test

import (
	"net/http"
	"reflect"
	"testing"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

func TestProtoRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		cred awswire.Credential
	}{
		{name: "document only", cred: awswire.Credential{Document: []byte(`{"a":1}`), Signature: []byte("c2ln")}},
		{name: "with STS proof", cred: awswire.Credential{
			Document:  []byte(`{"a":1}`),
			Signature: []byte("c2ln"),
			STS: &awswire.STSRequest{
				Method: http.MethodPost,
				URL:    "https://sts.us-east-2.amazonaws.com/",
				Headers: http.Header{
					"Authorization":           {"AWS4-HMAC-SHA256 Credential=..."},
					awswire.AudienceHeader:    {"onboarding.example.com"},
					"X-Amz-Date":              {"20260101T000000Z"},
					"X-Repeated-For-The-Test": {"one", "two"},
				},
				Body: []byte("Action=GetCallerIdentity&Version=2011-06-15"),
			},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := awswire.FromProto(awswire.ToProto(&tt.cred))
			if !reflect.DeepEqual(got, tt.cred) {
				t.Errorf("FromProto(ToProto(cred)) = %+v, want %+v", got, tt.cred)
			}
		})
	}
}

func TestFromProtoNil(t *testing.T) {
	got := awswire.FromProto(nil)
	if got.Document != nil || got.STS != nil || len(got.Signature) != 0 {
		t.Errorf("FromProto(nil) = %+v, want the empty credential", got)
	}
}

func TestPartitionForRegion(t *testing.T) {
	tests := []struct {
		region string
		want   string
	}{
		{"us-east-1", "aws"},
		{"us-east-2", "aws"},
		{"ap-southeast-7", "aws"},
		{"il-central-1", "aws"},
		{"cn-north-1", "aws-cn"},
		{"cn-northwest-1", "aws-cn"},
		{"us-gov-west-1", "aws-us-gov"},
		{"us-gov-east-1", "aws-us-gov"},
		{"eusc-de-east-1", "aws-eusc"},
		{"us-iso-east-1", "aws-iso"},
		{"us-isob-east-1", "aws-iso-b"},
		{"eu-isoe-west-1", "aws-iso-e"},
		{"us-isof-south-1", "aws-iso-f"},
	}
	for _, tt := range tests {
		t.Run(tt.region, func(t *testing.T) {
			if got := awswire.PartitionForRegion(tt.region); got != tt.want {
				t.Errorf("PartitionForRegion(%s) = %s, want %s", tt.region, got, tt.want)
			}
		})
	}
}

func TestIsRegionName(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"us-east-1", true}, {"us-gov-west-1", true}, {"eusc-de-east-1", true}, {"ap-southeast-7", true},
		{"us-isob-east-1", true}, {"cn-northwest-1", true},
		{"", false}, {"US-EAST-1", false}, {"us-east", false}, {"us-east-1a", false}, {"../etc", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := awswire.IsRegionName(tt.in); got != tt.want {
				t.Errorf("IsRegionName(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}
