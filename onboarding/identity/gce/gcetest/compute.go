package gcetest

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/embark-mesh/embark/onboarding/identity/jwt/jwttest"
	"golang.org/x/oauth2"
)

// accessToken is the one access token ComputeAPI issues and accepts.
const accessToken = "gcetest-access-token"

// ComputeInstance is an instance as ComputeAPI reports it.
type ComputeInstance struct {
	// ID is the numeric ID, Name the name, Status the status (RUNNING, ...).
	ID, Name, Status string
	// NetworkIPs are the networkIPs of nic0, nic1, ... (none: the instance
	// has no network interface).
	NetworkIPs []string
}

// ComputeOf is in as the Compute API reports it while it runs: RUNNING,
// nic0's address in.IP.
func ComputeOf(in Instance) ComputeInstance {
	return ComputeInstance{ID: in.InstanceID, Name: in.InstanceName, Status: "RUNNING", NetworkIPs: []string{in.IP}}
}

// ComputeAPI is a loopback Compute Engine API answering
// GET /compute/v1/projects/{project}/zones/{zone}/instances/{name} as
// compute.instances.get does, to requests carrying its access token, and a
// Google OAuth token endpoint (/token) that issues that token to a service
// account key's signed assertion (the JWT bearer flow).
type ComputeAPI struct {
	srv *httptest.Server

	mu        sync.Mutex
	instances map[string]ComputeInstance // project/zone/name
	fail      int
	calls     int
	tokens    int
}

// NewComputeAPI starts a Compute API without instances. Close it when done.
func NewComputeAPI() *ComputeAPI {
	c := &ComputeAPI{instances: map[string]ComputeInstance{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /compute/v1/projects/{project}/zones/{zone}/instances/{name}", c.serveInstance)
	mux.HandleFunc("POST /token", c.serveToken)
	c.srv = httptest.NewServer(mux)
	return c
}

// URL is the API's base URL (in place of https://compute.googleapis.com).
func (c *ComputeAPI) URL() string { return c.srv.URL }

// Close stops the server.
func (c *ComputeAPI) Close() { c.srv.Close() }

// Put makes the API report ci as instance ci.Name of project's zone.
func (c *ComputeAPI) Put(project, zone string, ci ComputeInstance) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.instances[project+"/"+zone+"/"+ci.Name] = ci
}

// PutInstance makes the API report in as running (ComputeOf).
func (c *ComputeAPI) PutInstance(in Instance) { c.Put(in.ProjectID, in.Zone, ComputeOf(in)) }

// Delete makes the API answer 404 for instance name of project's zone.
func (c *ComputeAPI) Delete(project, zone, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.instances, project+"/"+zone+"/"+name)
}

// Fail makes every instance request answer code (0: answer normally).
func (c *ComputeAPI) Fail(code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fail = code
}

// Calls is how many instance requests the API answered.
func (c *ComputeAPI) Calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// TokensIssued is how many access tokens the token endpoint issued.
func (c *ComputeAPI) TokensIssued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tokens
}

// TokenSource gives the access token the API accepts.
func (c *ComputeAPI) TokenSource() oauth2.TokenSource {
	return oauth2.StaticTokenSource(&oauth2.Token{AccessToken: accessToken, TokenType: "Bearer"})
}

// ServiceAccountKey is a Google service account key file (JSON) whose
// token_uri is this server's token endpoint, so that Google's own
// credentials code gets the API's access token with it.
func (c *ComputeAPI) ServiceAccountKey() ([]byte, error) {
	k, err := jwttest.NewKey()
	if err != nil {
		return nil, err
	}
	return serviceAccountKey(k, c.srv.URL+"/token")
}

func serviceAccountKey(k *rsa.PrivateKey, tokenURI string) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]string{
		"type": "service_account", "project_id": "embark-control", "private_key_id": "gcetest",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "embark-endpoint@embark-control.iam.gserviceaccount.com", "client_id": "1",
		"token_uri": tokenURI,
	})
}

func (c *ComputeAPI) serveToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" ||
		strings.Count(r.PostForm.Get("assertion"), ".") != 2 {
		http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.tokens++
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"access_token":%q,"token_type":"Bearer","expires_in":3600}`, accessToken)
}

func (c *ComputeAPI) serveInstance(w http.ResponseWriter, r *http.Request) {
	project, zone, name := r.PathValue("project"), r.PathValue("zone"), r.PathValue("name")
	c.mu.Lock()
	c.calls++
	fail := c.fail
	ci, ok := c.instances[project+"/"+zone+"/"+name]
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Header.Get("Authorization") != "Bearer "+accessToken:
		apiError(w, http.StatusUnauthorized, "Request had invalid authentication credentials.")
	case fail != 0:
		apiError(w, fail, "failing as told")
	case !ok:
		apiError(w, http.StatusNotFound, fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", project, zone, name))
	default:
		_ = json.NewEncoder(w).Encode(instanceResource(project, zone, ci))
	}
}

// instanceResource is ci as the Compute API writes an Instance resource.
func instanceResource(project, zone string, ci ComputeInstance) map[string]any {
	nics := []map[string]any{}
	for i, ip := range ci.NetworkIPs {
		nics = append(nics, map[string]any{
			"kind": "compute#networkInterface", "name": fmt.Sprintf("nic%d", i), "networkIP": ip,
			"network": fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/global/networks/default", project),
		})
	}
	return map[string]any{
		"kind": "compute#instance", "id": ci.ID, "name": ci.Name, "status": ci.Status,
		"zone":              fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s", project, zone),
		"selfLink":          fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s/instances/%s", project, zone, ci.Name),
		"networkInterfaces": nics,
	}
}

func apiError(w http.ResponseWriter, code int, msg string) {
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": msg}})
}
