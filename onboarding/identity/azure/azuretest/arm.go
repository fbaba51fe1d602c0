package azuretest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
)

// ARMToken is the bearer token the loopback Resource Manager accepts and
// its token endpoints issue.
const ARMToken = "azuretest-arm-token"

// ARM is a loopback Azure Resource Manager (plain HTTP) answering
// GET /subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<name>?api-version=2024-07-01
// and the VMs' network interfaces (?api-version=2024-05-01), paths
// compared without case, with ARMToken as bearer; and the token endpoints
// the onboarding endpoint gets that token from: an Instance Metadata
// Service (/metadata/identity/oauth2/token, resource
// https://management.azure.com/) and Entra ID's for workload identity
// (POST /<tenant>/oauth2/v2.0/token with a client assertion).
type ARM struct {
	srv *httptest.Server

	mu sync.Mutex
	// docs are the resources, by lower-case path.
	docs map[string]map[string]any
	// status, when not 0, answers every Resource Manager call.
	status int
	calls  int
	tokens int
}

// NewARM starts a Resource Manager knowing no VM. Close it when done.
func NewARM() *ARM {
	a := &ARM{docs: map[string]map[string]any{}}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	return a
}

// URL is the server's URL: the armEndpoint and the imdsEndpoint.
func (a *ARM) URL() string { return a.srv.URL }

// Close stops the server.
func (a *ARM) Close() { a.srv.Close() }

// NICID is the resource ID of vm's network interface.
func NICID(vm VM) string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/networkInterfaces/%s-nic", vm.SubscriptionID, vm.ResourceGroup, vm.Name)
}

// AddVM makes vm known, provisioned (Succeeded), with its principal as
// system-assigned identity, its location and VM ID, and one network
// interface whose primary private address is vm.IP.
func (a *ARM) AddVM(vm VM) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.docs[strings.ToLower(vm.ResourceID())] = map[string]any{
		"id": vm.ResourceID(), "name": vm.Name, "type": "Microsoft.Compute/virtualMachines", "location": vm.Location,
		"identity": map[string]any{"type": "SystemAssigned", "principalId": vm.PrincipalID, "tenantId": vm.TenantID},
		"properties": map[string]any{
			"vmId": vm.VMID, "provisioningState": "Succeeded",
			"networkProfile": map[string]any{"networkInterfaces": []any{
				map[string]any{"id": NICID(vm), "properties": map[string]any{"primary": true}},
			}},
		},
	}
	a.docs[strings.ToLower(NICID(vm))] = map[string]any{
		"id": NICID(vm), "location": vm.Location,
		"properties": map[string]any{"ipConfigurations": []any{
			map[string]any{"name": "ipconfig2", "properties": map[string]any{"primary": false, "privateIPAddress": "10.1.9.9"}},
			map[string]any{"name": "ipconfig1", "properties": map[string]any{"primary": true, "privateIPAddress": vm.IP, "privateIPAllocationMethod": "Dynamic"}},
		}},
	}
}

// EditVM changes vm's description (added before) with edit.
func (a *ARM) EditVM(vm VM, edit func(doc map[string]any)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	edit(a.docs[strings.ToLower(vm.ResourceID())])
}

// RemoveVM forgets vm; RemoveNIC forgets its network interface.
func (a *ARM) RemoveVM(vm VM) { a.remove(vm.ResourceID()) }

// RemoveNIC forgets vm's network interface.
func (a *ARM) RemoveNIC(vm VM) { a.remove(NICID(vm)) }

func (a *ARM) remove(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.docs, strings.ToLower(id))
}

// SetStatus makes every Resource Manager call answer code (0: answer
// normally).
func (a *ARM) SetStatus(code int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.status = code
}

// Calls counts the Resource Manager calls made with the token.
func (a *ARM) Calls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

// TokensIssued counts the tokens the token endpoints issued.
func (a *ARM) TokensIssued() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tokens
}

func (a *ARM) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/metadata/identity/oauth2/token":
		a.serveIMDSToken(w, r)
	case strings.HasSuffix(r.URL.Path, "/oauth2/v2.0/token"):
		a.serveFederatedToken(w, r)
	default:
		a.serveResource(w, r)
	}
}

func (a *ARM) serveIMDSToken(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Metadata") != "true" || r.URL.Query().Get("resource") != "https://management.azure.com/" {
		http.Error(w, `{"error":"invalid_request"}`, http.StatusBadRequest)
		return
	}
	a.issue(w, `"86399"`)
}

func (a *ARM) serveFederatedToken(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.ParseForm() != nil || r.PostForm.Get("client_assertion") == "" ||
		r.PostForm.Get("scope") != "https://management.azure.com/.default" || r.PostForm.Get("grant_type") != "client_credentials" {
		http.Error(w, `{"error":"invalid_request"}`, http.StatusBadRequest)
		return
	}
	a.issue(w, "3599")
}

func (a *ARM) issue(w http.ResponseWriter, expiresIn string) {
	a.mu.Lock()
	a.tokens++
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"access_token":%q,"token_type":"Bearer","expires_in":%s}`, ARMToken, expiresIn)
}

func (a *ARM) serveResource(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+ARMToken {
		http.Error(w, `{"error":{"code":"AuthenticationFailed"}}`, http.StatusUnauthorized)
		return
	}
	a.mu.Lock()
	a.calls++
	status, doc := a.status, a.docs[strings.ToLower(r.URL.Path)]
	var body []byte
	if doc != nil {
		body, _ = json.Marshal(doc)
	}
	a.mu.Unlock()
	v := r.URL.Query().Get("api-version")
	switch {
	case status != 0:
		http.Error(w, `{"error":{"code":"Injected"}}`, status)
	case v != "2024-07-01" && v != "2024-05-01":
		http.Error(w, `{"error":{"code":"InvalidApiVersionParameter"}}`, http.StatusBadRequest)
	case doc == nil:
		http.Error(w, `{"error":{"code":"ResourceNotFound"}}`, http.StatusNotFound)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}
}
