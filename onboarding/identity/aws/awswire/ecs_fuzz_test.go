package awswire_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

const sampleTaskMetadata = `{"Cluster":"arn:aws:ecs:us-west-2:111122223333:cluster/default","TaskARN":"arn:aws:ecs:us-west-2:111122223333:task/default/158d1c8083dd49d6b527399fd6414f5c","Family":"curltest","Revision":"26","DesiredStatus":"RUNNING","KnownStatus":"RUNNING","AvailabilityZone":"us-west-2d","LaunchType":"FARGATE","Containers":[{"Name":"curl","Networks":[{"NetworkMode":"awsvpc","IPv4Addresses":["10.0.2.106"]}]}]}`

// FuzzParseTaskMetadata: the task metadata parser never panics, and what
// it accepts has a task ARN that parses and agrees with itself.
func FuzzParseTaskMetadata(f *testing.F) {
	f.Add([]byte(sampleTaskMetadata))
	f.Add([]byte(strings.Replace(sampleTaskMetadata, "awsvpc", "bridge", 1)))
	f.Add([]byte(`{"TaskARN":"arn:aws:ecs:us-west-2:111122223333:task/158d1c8083dd49d6b527399fd6414f5c"}`))
	f.Add([]byte(`{"Containers":[{"Networks":[{"NetworkMode":"awsvpc","IPv4Addresses":["::1","300.1.1.1"]}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := awswire.ParseTaskMetadata(data)
		if err != nil {
			return
		}
		a, err := awswire.ParseTaskARN(m.TaskARN)
		if err != nil || m.Cluster == "" || m.AvailabilityZone == "" {
			t.Fatalf("accepted metadata %+v with task ARN error %v", m, err)
		}
		if a.Partition != awswire.PartitionForRegion(a.Region) || !awswire.IsAccountID(a.Account) {
			t.Fatalf("ParseTaskARN(%q) = %+v", m.TaskARN, a)
		}
		_ = m.Address()
	})
}

// FuzzParseTaskARN: an accepted task ARN is rebuilt exactly from its
// parts; ClusterName never panics.
func FuzzParseTaskARN(f *testing.F) {
	f.Add("arn:aws:ecs:us-west-2:111122223333:task/default/158d1c8083dd49d6b527399fd6414f5c")
	f.Add("arn:aws-cn:ecs:cn-north-1:111122223333:task/prod/abc")
	f.Add("arn:aws:ecs:us-west-2:111122223333:task/abc")
	f.Add("arn:aws:ecs:us-west-2:111122223333:cluster/default")
	f.Fuzz(func(t *testing.T, s string) {
		_ = awswire.ClusterName(s)
		a, err := awswire.ParseTaskARN(s)
		if err != nil {
			return
		}
		if got := "arn:" + a.Partition + ":ecs:" + a.Region + ":" + a.Account + ":task/" + a.Cluster + "/" + a.TaskID; got != s {
			t.Fatalf("ParseTaskARN(%q) = %+v, which rebuilds as %q", s, a, got)
		}
	})
}

// FuzzECSFromProto: any ECSCredential message converts without panicking,
// and converting back gives the same message.
func FuzzECSFromProto(f *testing.F) {
	seed, _ := proto.Marshal(awswire.ECSToProto(&awswire.ECSCredential{
		STS:     &awswire.STSRequest{Method: "POST", URL: "https://sts.us-east-2.amazonaws.com/", Headers: map[string][]string{"Authorization": {"x"}}, Body: []byte("Action=GetCallerIdentity&Version=2011-06-15")},
		Cluster: "prod", TaskARN: "arn:aws:ecs:us-east-2:123456789012:task/prod/abc", AvailabilityZone: "us-east-2b",
	}))
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		var m onboardingv1alpha1.ECSCredential
		if proto.Unmarshal(data, &m) != nil {
			return
		}
		cred := awswire.ECSFromProto(&m)
		back := awswire.ECSToProto(&cred)
		if back.GetTaskArn() != m.GetTaskArn() || back.GetCluster() != m.GetCluster() || back.GetAddress() != m.GetAddress() ||
			(back.GetStsGetCallerIdentity() == nil) != (m.GetStsGetCallerIdentity() == nil) {
			t.Fatalf("round trip changed the credential: %v -> %v", &m, back)
		}
	})
}
