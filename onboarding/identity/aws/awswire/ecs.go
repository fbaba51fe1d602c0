package awswire

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"strings"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// MaxTaskMetadataSize bounds the task metadata answer an agent parses.
const MaxTaskMetadataSize = 1 << 20

// ECSCredential is what an ECS task presents: a signed
// sts:GetCallerIdentity request made with the task role's credentials, and
// the task it claims to be, read from the task metadata endpoint v4.
type ECSCredential struct {
	STS              *STSRequest
	Cluster          string
	TaskARN          string
	Family           string
	Revision         string
	AvailabilityZone string
	// Address is the private IPv4 address of the task's ENI ("" when the
	// task has none).
	Address string
}

// TaskMetadata is what the agent uses of ${ECS_CONTAINER_METADATA_URI_V4}/task.
type TaskMetadata struct {
	Cluster          string `json:"Cluster"`
	TaskARN          string `json:"TaskARN"`
	Family           string `json:"Family"`
	Revision         string `json:"Revision"`
	AvailabilityZone string `json:"AvailabilityZone"`
	Containers       []struct {
		Networks []struct {
			NetworkMode   string   `json:"NetworkMode"`
			IPv4Addresses []string `json:"IPv4Addresses"`
		} `json:"Networks"`
	} `json:"Containers"`
}

// ParseTaskMetadata parses the task metadata endpoint v4's /task answer and
// checks the fields the agent sends: a task ARN, a cluster, an availability
// zone.
func ParseTaskMetadata(data []byte) (*TaskMetadata, error) {
	if len(data) > MaxTaskMetadataSize {
		return nil, fmt.Errorf("task metadata is %d bytes, more than %d", len(data), MaxTaskMetadataSize)
	}
	var m TaskMetadata
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("task metadata is not JSON: %w", err)
	}
	if _, err := ParseTaskARN(m.TaskARN); err != nil {
		return nil, fmt.Errorf("task metadata TaskARN: %w", err)
	}
	if m.Cluster == "" {
		return nil, errors.New("task metadata has no Cluster")
	}
	if m.AvailabilityZone == "" {
		return nil, errors.New("task metadata has no AvailabilityZone")
	}
	return &m, nil
}

// Address returns the task's ENI address: the first IPv4 address of an
// awsvpc network of its containers ("" when there is none: bridge and host
// network modes have no address of the task's own).
func (m *TaskMetadata) Address() string {
	for _, c := range m.Containers {
		for _, n := range c.Networks {
			if n.NetworkMode != "awsvpc" {
				continue
			}
			for _, a := range n.IPv4Addresses {
				if ip, err := netip.ParseAddr(a); err == nil && ip.Is4() {
					return ip.String()
				}
			}
		}
	}
	return ""
}

// TaskARN is a parsed ECS task ARN in the long format,
// arn:<partition>:ecs:<region>:<account>:task/<cluster>/<task-id>.
type TaskARN struct {
	Partition, Region, Account, Cluster, TaskID string
}

var (
	clusterName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,255}$`)
	taskID      = regexp.MustCompile(`^[0-9a-zA-Z_-]{1,64}$`)
	partition   = regexp.MustCompile(`^aws(-[a-z]+)*$`)
)

// ParseTaskARN parses a task ARN. The short format (task/<task-id>, without
// the cluster) is refused: every task launched since 2021 has the long one.
func ParseTaskARN(s string) (*TaskARN, error) {
	parts := strings.SplitN(s, ":", 6)
	if len(parts) != 6 || parts[0] != "arn" || parts[2] != "ecs" {
		return nil, fmt.Errorf("%q is not an ECS ARN", clip(s))
	}
	if !partition.MatchString(parts[1]) || !IsRegionName(parts[3]) || !IsAccountID(parts[4]) {
		return nil, fmt.Errorf("task ARN %q has a bad partition, region or account", clip(s))
	}
	res := strings.Split(parts[5], "/")
	if len(res) != 3 || res[0] != "task" || !clusterName.MatchString(res[1]) || !taskID.MatchString(res[2]) {
		return nil, fmt.Errorf("task ARN %q is not of the form ...:task/<cluster>/<task-id>", clip(s))
	}
	if PartitionForRegion(parts[3]) != parts[1] {
		return nil, fmt.Errorf("task ARN %q names region %s of partition %s", clip(s), parts[3], PartitionForRegion(parts[3]))
	}
	return &TaskARN{Partition: parts[1], Region: parts[3], Account: parts[4], Cluster: res[1], TaskID: res[2]}, nil
}

// ClusterName returns the name of a cluster given as its name or its ARN
// (arn:<partition>:ecs:<region>:<account>:cluster/<name>), as task metadata
// and DescribeTasks report it.
func ClusterName(s string) string {
	if !strings.HasPrefix(s, "arn:") {
		return s
	}
	parts := strings.SplitN(s, ":", 6)
	if len(parts) != 6 {
		return s
	}
	name, ok := strings.CutPrefix(parts[5], "cluster/")
	if !ok {
		return s
	}
	return name
}

// ECSToProto is the wire form of cred, as an agent sends it in
// AuthorizeRequest.
func ECSToProto(cred *ECSCredential) *onboardingv1alpha1.ECSCredential {
	out := &onboardingv1alpha1.ECSCredential{
		Cluster: cred.Cluster, TaskArn: cred.TaskARN, Family: cred.Family, Revision: cred.Revision,
		AvailabilityZone: cred.AvailabilityZone, Address: cred.Address,
	}
	if cred.STS != nil {
		out.StsGetCallerIdentity = signedToProto(cred.STS)
	}
	return out
}

// ECSFromProto is the inverse of [ECSToProto]: the credential an
// AuthorizeRequest carries, unverified. A nil c gives an empty credential.
func ECSFromProto(c *onboardingv1alpha1.ECSCredential) ECSCredential {
	cred := ECSCredential{
		Cluster: c.GetCluster(), TaskARN: c.GetTaskArn(), Family: c.GetFamily(), Revision: c.GetRevision(),
		AvailabilityZone: c.GetAvailabilityZone(), Address: c.GetAddress(),
	}
	if r := c.GetStsGetCallerIdentity(); r != nil {
		cred.STS = signedFromProto(r)
	}
	return cred
}

func signedToProto(s *STSRequest) *onboardingv1alpha1.SignedHTTPRequest {
	r := &onboardingv1alpha1.SignedHTTPRequest{Method: s.Method, Url: s.URL, Body: s.Body}
	for name, vals := range s.Headers {
		for _, v := range vals {
			r.Headers = append(r.Headers, &onboardingv1alpha1.Header{Name: name, Value: v})
		}
	}
	return r
}

func signedFromProto(r *onboardingv1alpha1.SignedHTTPRequest) *STSRequest {
	h := http.Header{}
	for _, kv := range r.GetHeaders() {
		h.Add(kv.GetName(), kv.GetValue())
	}
	return &STSRequest{Method: r.GetMethod(), URL: r.GetUrl(), Headers: h, Body: r.GetBody()}
}

func clip(s string) string {
	if len(s) <= 200 {
		return s
	}
	return s[:200] + "..."
}
