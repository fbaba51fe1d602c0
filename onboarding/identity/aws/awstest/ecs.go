package awstest

import (
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Task is an ECS task as the ECS fakes serve it.
type Task struct {
	// Account, Region and Cluster (a name) place the task. Defaults:
	// 123456789012, us-east-2, prod.
	Account, Region, Cluster string
	// TaskID is the task's ID. Default: 32 hex digits.
	TaskID string
	// Zone is the task's availability zone. Default: <region>b.
	Zone string
	// Family and Revision name the task definition. Default: ratings, 3.
	Family   string
	Revision int
	// Role is the task definition's task role's name; "" means none.
	Role string
	// RoleOverride, when set, is the task role RunTask overrode Role with
	// (overrides.taskRoleArn): the role whose session the task gets.
	RoleOverride string
	// Address is the private IPv4 address of the task's ENI. Default 10.0.3.17.
	Address string
	// LastStatus and DesiredStatus default to RUNNING.
	LastStatus, DesiredStatus string
}

func (t Task) withDefaults() Task {
	if t.Account == "" {
		t.Account = "123456789012"
	}
	if t.Region == "" {
		t.Region = "us-east-2"
	}
	if t.Cluster == "" {
		t.Cluster = "prod"
	}
	if t.TaskID == "" {
		t.TaskID = randomHex(16)
	}
	if t.Zone == "" {
		t.Zone = t.Region + "b"
	}
	if t.Family == "" {
		t.Family = "ratings"
	}
	if t.Revision == 0 {
		t.Revision = 3
	}
	if t.Address == "" {
		t.Address = "10.0.3.17"
	}
	if t.LastStatus == "" {
		t.LastStatus = "RUNNING"
	}
	if t.DesiredStatus == "" {
		t.DesiredStatus = "RUNNING"
	}
	return t
}

func (t Task) partition() string { return Instance{Region: t.Region}.Partition() }

// ARN is the task's ARN (long format).
func (t Task) ARN() string {
	return fmt.Sprintf("arn:%s:ecs:%s:%s:task/%s/%s", t.partition(), t.Region, t.Account, t.Cluster, t.TaskID)
}

// ClusterARN is the ARN of the task's cluster.
func (t Task) ClusterARN() string {
	return fmt.Sprintf("arn:%s:ecs:%s:%s:cluster/%s", t.partition(), t.Region, t.Account, t.Cluster)
}

// DefinitionARN is the ARN of the task's task definition.
func (t Task) DefinitionARN() string {
	return fmt.Sprintf("arn:%s:ecs:%s:%s:task-definition/%s:%d", t.partition(), t.Region, t.Account, t.Family, t.Revision)
}

// RoleARN is the ARN of the task definition's task role ("" without one).
func (t Task) RoleARN() string { return t.roleARN(t.Role) }

func (t Task) roleARN(name string) string {
	if name == "" {
		return ""
	}
	return fmt.Sprintf("arn:%s:iam::%s:role/%s", t.partition(), t.Account, name)
}

// sessionRole is the role whose session the task's containers get.
func (t Task) sessionRole() string {
	if t.RoleOverride != "" {
		return t.RoleOverride
	}
	return t.Role
}

// ECS is a loopback fake of the two ECS API queries the endpoint's task
// check makes: DescribeTasks and DescribeTaskDefinition (AWS JSON 1.1,
// X-Amz-Target AmazonEC2ContainerServiceV20141113.<op>). Requests must be
// SigV4-signed for service ecs with the static key pair
// AccessKeyID/SecretAccessKey. Tasks are keyed by ARN; a task's role comes
// from its task definition (as when RunTask overrides no role). Create it
// with [NewECS]; Close it when done.
type ECS struct {
	// URL is the endpoint, http://127.0.0.1:<port>.
	URL string
	// AccessKeyID and SecretAccessKey are the only credentials accepted
	// (set them with WithECSKey).
	AccessKeyID, SecretAccessKey string

	server *httptest.Server
	mu     sync.Mutex
	tasks  map[string]Task
	calls  map[string]int
}

// ECSOption configures an ECS fake.
type ECSOption func(*ECS)

// WithECSKey sets the only key pair the fake accepts (default: its own
// AKIDEMBARKECSCHECK pair), e.g. the endpoint's own credentials.
func WithECSKey(accessKeyID, secretAccessKey string) ECSOption {
	return func(f *ECS) { f.AccessKeyID, f.SecretAccessKey = accessKeyID, secretAccessKey }
}

// NewECS starts an ECS fake that knows no task.
func NewECS(opts ...ECSOption) *ECS {
	f := &ECS{AccessKeyID: "AKIDEMBARKECSCHECK", SecretAccessKey: "embark-ecs-check-secret",
		tasks: map[string]Task{}, calls: map[string]int{}}
	for _, o := range opts {
		o(f)
	}
	f.server = httptest.NewServer(http.HandlerFunc(f.serve))
	f.URL = f.server.URL
	return f
}

// Close stops the server.
func (f *ECS) Close() { f.server.Close() }

// Put adds (or replaces) a task; defaults are filled in and the task is
// returned.
func (f *ECS) Put(t Task) Task {
	t = t.withDefaults()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tasks[t.ARN()] = t
	return t
}

// Calls returns how many requests of op (DescribeTasks,
// DescribeTaskDefinition) were answered.
func (f *ECS) Calls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *ECS) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil || r.Method != http.MethodPost {
		f.fail(w, http.StatusBadRequest, "ClientException", "bad request")
		return
	}
	sig, err := parseSigV4(r.Header.Get("Authorization"))
	if err != nil || sig.service != "ecs" || sig.accessKeyID != f.AccessKeyID {
		f.fail(w, http.StatusForbidden, "UnrecognizedClientException", "The security token included in the request is invalid.")
		return
	}
	amzDate := r.Header.Get("X-Amz-Date")
	canonical, err := canonicalRequest(r, body, sig.signedHeaders)
	if err != nil || !hmac.Equal([]byte(expectedSignature(f.SecretAccessKey, amzDate, sig, canonical)), []byte(sig.signature)) {
		f.fail(w, http.StatusForbidden, "InvalidSignatureException", "The request signature we calculated does not match the signature you provided.")
		return
	}
	switch r.Header.Get("X-Amz-Target") {
	case "AmazonEC2ContainerServiceV20141113.DescribeTasks":
		f.describeTasks(w, body)
	case "AmazonEC2ContainerServiceV20141113.DescribeTaskDefinition":
		f.describeTaskDefinition(w, body)
	default:
		f.fail(w, http.StatusBadRequest, "UnknownOperationException", "unknown operation")
	}
}

func (f *ECS) describeTasks(w http.ResponseWriter, body []byte) {
	var in struct {
		Cluster string   `json:"cluster"`
		Tasks   []string `json:"tasks"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		f.fail(w, http.StatusBadRequest, "InvalidParameterException", err.Error())
		return
	}
	f.mu.Lock()
	f.calls["DescribeTasks"]++
	type kv struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	var tasks, failures []map[string]any
	for _, a := range in.Tasks {
		t, ok := f.tasks[a]
		if !ok || (in.Cluster != t.Cluster && in.Cluster != t.ClusterARN()) {
			failures = append(failures, map[string]any{"arn": a, "reason": "MISSING"})
			continue
		}
		overrides := map[string]any{"containerOverrides": []any{}}
		if t.RoleOverride != "" {
			overrides["taskRoleArn"] = t.roleARN(t.RoleOverride)
		}
		tasks = append(tasks, map[string]any{
			"taskArn": t.ARN(), "clusterArn": t.ClusterARN(), "taskDefinitionArn": t.DefinitionARN(),
			"lastStatus": t.LastStatus, "desiredStatus": t.DesiredStatus, "availabilityZone": t.Zone,
			"launchType": "FARGATE", "overrides": overrides,
			"attachments": []any{map[string]any{"id": "eni-attach-1", "type": "ElasticNetworkInterface", "status": "ATTACHED",
				"details": []kv{{"subnetId", "subnet-0abc"}, {"networkInterfaceId", "eni-0abc"}, {"privateIPv4Address", t.Address}}}},
		})
	}
	f.mu.Unlock()
	writeAMZJSON(w, map[string]any{"tasks": tasks, "failures": failures})
}

func (f *ECS) describeTaskDefinition(w http.ResponseWriter, body []byte) {
	var in struct {
		TaskDefinition string `json:"taskDefinition"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		f.fail(w, http.StatusBadRequest, "InvalidParameterException", err.Error())
		return
	}
	f.mu.Lock()
	f.calls["DescribeTaskDefinition"]++
	var def map[string]any
	for _, t := range f.tasks {
		if t.DefinitionARN() == in.TaskDefinition {
			def = map[string]any{"taskDefinitionArn": t.DefinitionARN(), "family": t.Family, "revision": t.Revision, "status": "ACTIVE"}
			if t.Role != "" {
				def["taskRoleArn"] = t.RoleARN()
			}
		}
	}
	f.mu.Unlock()
	if def == nil {
		f.fail(w, http.StatusBadRequest, "ClientException", "Unable to describe task definition.")
		return
	}
	writeAMZJSON(w, map[string]any{"taskDefinition": def})
}

func (f *ECS) fail(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-Errortype", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "message": msg})
}

func writeAMZJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-Requestid", requestID())
	_ = json.NewEncoder(w).Encode(v)
}

// TaskMetadata is a loopback fake of what an ECS task's containers reach:
// the task metadata endpoint v4 (${ECS_CONTAINER_METADATA_URI_V4} and its
// /task) and the container credentials endpoint, which serves the task
// role's credentials (issued by the STS fake for the session <role>/<task
// ID>, as ECS creates it) at a relative URI, or at a full URI when a
// Authorization token is required. Create it with [NewTaskMetadata].
type TaskMetadata struct {
	// MetadataURI is the value of ECS_CONTAINER_METADATA_URI_V4.
	MetadataURI string
	// CredentialsURI is a full URI of the credentials
	// (AWS_CONTAINER_CREDENTIALS_FULL_URI); CredentialsRelativeURI is its
	// path (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI).
	CredentialsURI, CredentialsRelativeURI string
	// AuthorizationToken is the AWS_CONTAINER_AUTHORIZATION_TOKEN the
	// credentials endpoint requires when set.
	AuthorizationToken string

	server *httptest.Server
	task   Task
	sts    *STS
	now    func() time.Time

	mu    sync.Mutex
	creds *Credentials
}

// NewTaskMetadata starts the endpoints of task t (defaults filled in), whose
// role credentials come from sts. token, when not empty, is required in the
// Authorization header of credential requests.
func NewTaskMetadata(t Task, sts *STS, token string) *TaskMetadata {
	m := &TaskMetadata{task: t.withDefaults(), sts: sts, now: time.Now, AuthorizationToken: token}
	m.server = httptest.NewServer(http.HandlerFunc(m.serve))
	m.MetadataURI = m.server.URL + "/v4/" + randomHex(8)
	m.CredentialsRelativeURI = "/v2/credentials/" + randomHex(8)
	m.CredentialsURI = m.server.URL + m.CredentialsRelativeURI
	return m
}

// Close stops the server.
func (m *TaskMetadata) Close() { m.server.Close() }

// Task is the task served.
func (m *TaskMetadata) Task() Task { return m.task }

func (m *TaskMetadata) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	meta := strings.TrimPrefix(m.MetadataURI, m.server.URL)
	switch r.URL.Path {
	case meta + "/task":
		writeJSON(w, m.taskJSON())
	case meta:
		writeJSON(w, map[string]any{"Name": "embark-agent", "Networks": m.networks()})
	case m.CredentialsRelativeURI:
		if m.AuthorizationToken != "" && r.Header.Get("Authorization") != m.AuthorizationToken {
			http.Error(w, `{"code":"AccessDenied","message":"bad authorization token"}`, http.StatusForbidden)
			return
		}
		if m.task.sessionRole() == "" {
			http.Error(w, `{"code":"NotFound","message":"the task has no task role"}`, http.StatusNotFound)
			return
		}
		c := m.roleCredentials()
		writeJSON(w, map[string]string{
			"RoleArn": m.task.roleARN(m.task.sessionRole()), "AccessKeyId": c.AccessKeyID, "SecretAccessKey": c.SecretAccessKey,
			"Token": c.SessionToken, "Expiration": c.Expiration.UTC().Format(time.RFC3339),
		})
	default:
		http.NotFound(w, r)
	}
}

func (m *TaskMetadata) networks() []map[string]any {
	return []map[string]any{{"NetworkMode": "awsvpc", "IPv4Addresses": []string{m.task.Address}}}
}

func (m *TaskMetadata) taskJSON() map[string]any {
	t := m.task
	return map[string]any{
		"Cluster": t.ClusterARN(), "TaskARN": t.ARN(), "Family": t.Family, "Revision": fmt.Sprint(t.Revision),
		"DesiredStatus": t.DesiredStatus, "KnownStatus": t.LastStatus, "AvailabilityZone": t.Zone, "LaunchType": "FARGATE",
		"Containers": []map[string]any{{"Name": "embark-agent", "Networks": m.networks()}},
	}
}

// RoleCredentials returns the task role credentials the endpoint serves,
// issuing them if needed.
func (m *TaskMetadata) RoleCredentials() Credentials { return m.roleCredentials() }

func (m *TaskMetadata) roleCredentials() Credentials {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.creds == nil || m.creds.Expiration.Sub(m.now()) < 5*time.Minute {
		t := m.task
		c := m.sts.IssueRole(t.partition(), t.Account, t.sessionRole(), t.TaskID, time.Hour)
		m.creds = &c
	}
	return *m.creds
}
