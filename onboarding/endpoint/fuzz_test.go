package endpoint

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	istioapi "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/registry"
)

// FuzzAuthorizeRequest feeds arbitrary bytes through everything the endpoint
// does with an AuthorizeRequest before it touches the API server: decoding,
// validation and AWS verification against the embedded certificates.
func FuzzAuthorizeRequest(f *testing.F) {
	seed := func(m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: "bookinfo", Name: "ratings"},
		Credential: &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: &onboardingv1alpha1.AWSCredential{
			InstanceIdentityDocument: []byte(`{"accountId":"123456789012","region":"us-east-2","availabilityZone":"us-east-2b","instanceId":"i-1234567890abcdef0"}`),
			Rsa2048Signature:         "MIAGCSqGSIb3DQEHAqCAMIACAQExDzANBglghkgBZQMEAgEFADCABgkqhkiG9w0BBwGggCSABIIB",
			StsGetCallerIdentity: &onboardingv1alpha1.SignedHTTPRequest{Method: "POST", Url: "https://sts.us-east-2.amazonaws.com/",
				Headers: []*onboardingv1alpha1.Header{{Name: "Authorization", Value: "AWS4-HMAC-SHA256 Credential=AKIA/20260101/us-east-2/sts/aws4_request"}},
				Body:    []byte("Action=GetCallerIdentity&Version=2011-06-15")},
		}},
	})
	seed(&onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: "bookinfo", Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Jwt{Jwt: &onboardingv1alpha1.JWTCredential{Token: "eyJhbGciOiJub25lIn0.e30."}},
	})
	seed(&onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: "bookinfo", Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Azure{Azure: &onboardingv1alpha1.AzureCredential{Token: "eyJhbGciOiJub25lIn0.e30."}},
	})
	seed(&onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: "bookinfo", Name: "ratings"},
		Credential: &onboardingv1alpha1.AuthorizeRequest_Ecs{Ecs: &onboardingv1alpha1.ECSCredential{
			StsGetCallerIdentity: &onboardingv1alpha1.SignedHTTPRequest{Method: "POST", Url: "https://sts.us-east-2.amazonaws.com/",
				Headers: []*onboardingv1alpha1.Header{{Name: "Authorization", Value: "AWS4-HMAC-SHA256 Credential=ASIA/20260101/us-east-2/sts/aws4_request"}},
				Body:    []byte("Action=GetCallerIdentity&Version=2011-06-15")},
			Cluster: "arn:aws:ecs:us-east-2:123456789012:cluster/prod", TaskArn: "arn:aws:ecs:us-east-2:123456789012:task/prod/158d1c8083dd49d6b527399fd6414f5c",
			Family: "ratings", Revision: "3", AvailabilityZone: "us-east-2b", Address: "10.0.3.17",
		}},
	})
	f.Add([]byte{0x0a, 0xff, 0xff})
	verifier, err := awsidentity.NewVerifier(audience)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &onboardingv1alpha1.AuthorizeRequest{}
		if err := proto.Unmarshal(data, req); err != nil {
			return
		}
		if err := ValidateAuthorizeRequest(req); err != nil {
			return
		}
		if a := req.GetAws(); a != nil {
			// No STS request is sent: only the document path runs offline.
			if _, err := verifier.VerifyDocument(a.GetInstanceIdentityDocument(), []byte(a.GetRsa2048Signature())); err == nil {
				t.Fatalf("a fuzzed document verified against AWS's certificates: %q", a.GetInstanceIdentityDocument())
			}
		}
	})
}

// FuzzRegisterRequest feeds arbitrary bytes through decoding and validation of
// a RegisterRequest and the registry's own validation of what it reports.
func FuzzRegisterRequest(f *testing.F) {
	b, err := proto.Marshal(&onboardingv1alpha1.RegisterRequest{
		Addresses:     []*onboardingv1alpha1.HostAddress{{Ip: "172.31.5.254", Type: "VPC"}},
		ConnectedOver: "VPC", AgentVersion: "v1.4.0", IstioSidecarVersion: "1.9.8", Labels: map[string]string{"version": "v5"},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{0x0a, 0x00})
	b, err = proto.Marshal(&onboardingv1alpha1.RegisterRequest{
		Addresses:     []*onboardingv1alpha1.HostAddress{{Ip: "172.31.5.254", Type: "VPC"}},
		ConnectedOver: "VPC", AgentVersion: "v1.4.0",
		LastError: &onboardingv1alpha1.AgentError{Reason: "PermissionDenied", Message: "not authorized to onboard\u202e\x1b[2J"},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	group := &istionetworkingv1.WorkloadGroup{}
	group.Name = "ratings"
	group.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": "ratings"}}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &onboardingv1alpha1.RegisterRequest{}
		if err := proto.Unmarshal(data, req); err != nil {
			return
		}
		if err := ValidateRegisterRequest(req); err != nil {
			return
		}
		// A last error that passes is safe to print in kubectl's output.
		if e := agentErrorOf(req); e != nil {
			if !agentErrorReason.MatchString(e.Reason) || len(e.Message) > maxErrorMsgBytes || strings.ContainsFunc(e.Message, unprintable) {
				t.Fatalf("validated last error %q: %q is not a word, or its message is too long or unprintable", e.Reason, e.Message)
			}
		}
		reg := reportedRegistration(req)
		if errs := registry.ValidateRegistration(reg, group); len(errs) > 0 {
			return
		}
		// Whatever passes both has an address to put in the mesh, and
		// no label the group did not allow.
		if _, err := registry.WorkloadAddress(reg); err != nil {
			t.Fatalf("validated registration has no workload address: %v", err)
		}
		for k, v := range reg.Workload.Labels {
			if registry.ReservedLabel(k) || (k != "version" && !(k == "app" && v == "ratings")) {
				t.Fatalf("validated registration sets label %s=%s, which the group does not allow", k, v)
			}
		}
	})
}
