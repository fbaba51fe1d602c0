package awstest

import (
	"crypto/hmac"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
)

// EC2IAM is a loopback fake of the two EC2 and IAM queries an instance
// profile check makes: ec2:DescribeIamInstanceProfileAssociations (filters
// instance-id and state) and iam:GetInstanceProfile. It serves both APIs on
// one URL (the SDK clients are pointed at it with BaseEndpoint) and tells
// them apart by the signature's service. Requests must be SigV4-signed with
// the static key pair AccessKeyID/SecretAccessKey (checked with this
// package's own SigV4 implementation, as the fake STS checks). Create it
// with [NewEC2IAM]; Close it when done.
type EC2IAM struct {
	// URL is the endpoint, http://127.0.0.1:<port>.
	URL string
	// AccessKeyID and SecretAccessKey are the only credentials accepted.
	AccessKeyID, SecretAccessKey string

	server *httptest.Server
	mu     sync.Mutex
	// instance ID -> instance profile ARN
	associations map[string]string
	// instance profile ARN -> role names
	profiles map[string][]string
	calls    map[string]int // action -> calls answered
}

// NewEC2IAM starts an EC2IAM with no instance profiles.
func NewEC2IAM() *EC2IAM {
	f := &EC2IAM{AccessKeyID: "AKIDEMBARKPROFILECHECK", SecretAccessKey: "embark-profile-check-secret",
		associations: map[string]string{}, profiles: map[string][]string{}, calls: map[string]int{}}
	f.server = httptest.NewServer(http.HandlerFunc(f.serve))
	f.URL = f.server.URL
	return f
}

// Close stops the server.
func (f *EC2IAM) Close() { f.server.Close() }

// SetProfile creates (or replaces) the instance profile arn with roles.
func (f *EC2IAM) SetProfile(arn string, roles ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.profiles[arn] = roles
}

// Associate associates the instance profile arn with instance ("" removes
// the association).
func (f *EC2IAM) Associate(instance, arn string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if arn == "" {
		delete(f.associations, instance)
		return
	}
	f.associations[instance] = arn
}

// Calls returns how many requests of action (DescribeIamInstanceProfileAssociations,
// GetInstanceProfile) were answered.
func (f *EC2IAM) Calls(action string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[action]
}

func (f *EC2IAM) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil || r.Method != http.MethodPost {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	sig, err := parseSigV4(r.Header.Get("Authorization"))
	if err != nil {
		f.fail(w, "", http.StatusForbidden, "IncompleteSignature", err.Error())
		return
	}
	amzDate := r.Header.Get("X-Amz-Date")
	signedAt, err := time.Parse("20060102T150405Z", amzDate)
	if err != nil || sig.date != signedAt.Format("20060102") {
		f.fail(w, sig.service, http.StatusForbidden, "SignatureDoesNotMatch", "bad X-Amz-Date")
		return
	}
	if sig.accessKeyID != f.AccessKeyID {
		f.fail(w, sig.service, http.StatusForbidden, "AuthFailure", "AWS was not able to validate the provided access credentials")
		return
	}
	canonical, err := canonicalRequest(r, body, sig.signedHeaders)
	if err != nil || !hmac.Equal([]byte(expectedSignature(f.SecretAccessKey, amzDate, sig, canonical)), []byte(sig.signature)) {
		f.fail(w, sig.service, http.StatusForbidden, "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided.")
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		f.fail(w, sig.service, http.StatusBadRequest, "MalformedQueryString", "malformed form body")
		return
	}
	switch action := form.Get("Action"); {
	case sig.service == "ec2" && action == "DescribeIamInstanceProfileAssociations":
		f.describe(w, form)
	case sig.service == "iam" && action == "GetInstanceProfile":
		f.getProfile(w, form)
	default:
		f.fail(w, sig.service, http.StatusBadRequest, "InvalidAction", "The action "+action+" is not valid for this web service.")
	}
}

// filters returns EC2's Filter.N.Name / Filter.N.Value.M parameters.
func filters(form url.Values) map[string][]string {
	out := map[string][]string{}
	for n := 1; ; n++ {
		name := form.Get(fmt.Sprintf("Filter.%d.Name", n))
		if name == "" {
			return out
		}
		for m := 1; ; m++ {
			v := form.Get(fmt.Sprintf("Filter.%d.Value.%d", n, m))
			if v == "" {
				break
			}
			out[name] = append(out[name], v)
		}
	}
}

func (f *EC2IAM) describe(w http.ResponseWriter, form url.Values) {
	fs := filters(form)
	f.mu.Lock()
	f.calls["DescribeIamInstanceProfileAssociations"]++
	var items strings.Builder
	for instance, arn := range f.associations {
		if ids, ok := fs["instance-id"]; ok && !contains(ids, instance) {
			continue
		}
		if st, ok := fs["state"]; ok && !contains(st, "associated") {
			continue
		}
		fmt.Fprintf(&items, `<item><associationId>iip-assoc-%s</associationId><instanceId>%s</instanceId><iamInstanceProfile><arn>%s</arn><id>AIPAEMBARK</id></iamInstanceProfile><state>associated</state></item>`,
			xmlEscape(instance), xmlEscape(instance), xmlEscape(arn))
	}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/xml")
	fmt.Fprintf(w, `<DescribeIamInstanceProfileAssociationsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>%s</requestId><iamInstanceProfileAssociationSet>%s</iamInstanceProfileAssociationSet></DescribeIamInstanceProfileAssociationsResponse>`,
		requestID(), items.String())
}

func (f *EC2IAM) getProfile(w http.ResponseWriter, form url.Values) {
	name := form.Get("InstanceProfileName")
	f.mu.Lock()
	f.calls["GetInstanceProfile"]++
	var arns []string
	for a := range f.profiles {
		if a[strings.LastIndex(a, "/")+1:] == name {
			arns = append(arns, a)
		}
	}
	sort.Strings(arns)
	var roles []string
	if len(arns) == 1 {
		roles = f.profiles[arns[0]]
	}
	f.mu.Unlock()
	switch {
	case len(arns) == 0:
		f.fail(w, "iam", http.StatusNotFound, "NoSuchEntity", "Instance Profile "+name+" cannot be found.")
		return
	case len(arns) > 1:
		// IAM answers for the caller's account; this fake takes one set of
		// credentials for every account and cannot tell which is asked.
		f.fail(w, "iam", http.StatusBadRequest, "AmbiguousInstanceProfile", ambiguous(name, arns))
		return
	}
	arn := arns[0]
	account := strings.SplitN(arn, ":", 6)[4]
	var members strings.Builder
	for _, r := range roles {
		fmt.Fprintf(&members, `<member><Path>/</Path><RoleName>%s</RoleName><RoleId>AROAEMBARK</RoleId><Arn>arn:aws:iam::%s:role/%s</Arn><CreateDate>2024-01-01T00:00:00Z</CreateDate></member>`,
			xmlEscape(r), account, xmlEscape(r))
	}
	w.Header().Set("Content-Type", "text/xml")
	fmt.Fprintf(w, `<GetInstanceProfileResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><GetInstanceProfileResult><InstanceProfile><Path>/</Path><InstanceProfileName>%s</InstanceProfileName><InstanceProfileId>AIPAEMBARK</InstanceProfileId><Arn>%s</Arn><CreateDate>2024-01-01T00:00:00Z</CreateDate><Roles>%s</Roles></InstanceProfile></GetInstanceProfileResult><ResponseMetadata><RequestId>%s</RequestId></ResponseMetadata></GetInstanceProfileResponse>`,
		xmlEscape(name), xmlEscape(arn), members.String(), requestID())
}

// ambiguous says that the instance profiles arns of several accounts are
// all named name.
func ambiguous(name string, arns []string) string {
	accounts := make([]string, len(arns))
	for i, a := range arns {
		accounts[i] = strings.SplitN(a, ":", 6)[4]
	}
	return fmt.Sprintf("awstest.EC2IAM: instance profile %s exists in accounts %s (%s): the fake's one set of credentials cannot tell which account GetInstanceProfile asks about; give it one account's profiles only",
		name, strings.Join(accounts, " and "), strings.Join(arns, ", "))
}

// fail answers AWS's error XML: EC2's <Response><Errors> shape or the
// query APIs' <ErrorResponse>.
func (f *EC2IAM) fail(w http.ResponseWriter, service string, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	if service == "ec2" {
		fmt.Fprintf(w, `<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>%s</RequestID></Response>`, code, xmlEscape(msg), requestID())
		return
	}
	fmt.Fprintf(w, `<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>%s</RequestId></ErrorResponse>`, code, xmlEscape(msg), requestID())
}

func contains(list []string, v string) bool {
	for _, s := range list {
		if s == v {
			return true
		}
	}
	return false
}
