package istiodnode

import (
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/test/fixtures"
)

var sidecarID = nodeid.Build("10.0.0.5", types.NamespacedName{Namespace: "bookinfo", Name: "ratings-vm-1"})

// registration is a registration of the example ratings group (template
// labels app=ratings and class=vm, service account ratings-vm, network
// virtual-machines unless network says otherwise) at 10.0.0.5 that
// reported the label version=v1.
func registration(t testing.TB, id runtimev1alpha1.WorkloadIdentity, network string) *runtimev1alpha1.WorkloadAutoRegistration {
	t.Helper()
	wg := fixtures.SeedGroup("bookinfo")
	wg.Spec.Template.Network = network
	snap, err := registry.Snapshot(wg)
	if err != nil {
		t.Fatal(err)
	}
	reg := fixtures.Registration("10.0.0.5")
	reg.Workload.Labels = map[string]string{"version": "v1"}
	return &runtimev1alpha1.WorkloadAutoRegistration{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bookinfo", Name: "ratings-vm-1", UID: "u-1", Generation: 1},
		Spec:       runtimev1alpha1.WorkloadAutoRegistrationSpec{WorkloadGroup: snap, Identity: id, Registration: reg},
	}
}

// sidecarNode is the sidecar's node with metadata md.
func sidecarNode(t testing.TB, md map[string]any) *core.Node {
	t.Helper()
	s, err := structpb.NewStruct(md)
	if err != nil {
		t.Fatal(err)
	}
	return &core.Node{Id: sidecarID, Cluster: "ratings.bookinfo", Metadata: s, UserAgentName: "envoy",
		Locality: &core.Locality{Region: "eu-west-1", Zone: "eu-west-1a"}}
}

// identity is the metadata Build sets from the registration of
// registration(t, fixtures.AWSIdentity(...)) with cluster ID Kubernetes:
// the labels are those of its WorkloadEntry.
func identity(t testing.TB, war *runtimev1alpha1.WorkloadAutoRegistration) map[string]any {
	t.Helper()
	we, err := registry.BuildWorkloadEntry(war)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]any{}
	for k, v := range we.Spec.Labels {
		labels[k] = v
	}
	return map[string]any{
		"NAMESPACE": "bookinfo", "SERVICE_ACCOUNT": fixtures.ServiceAccount, "INSTANCE_IPS": "10.0.0.5",
		"CLUSTER_ID": "Kubernetes", "NETWORK": "virtual-machines", "WORKLOAD_NAME": fixtures.GroupName, "LABELS": labels,
	}
}

func with(base map[string]any, extra map[string]any) map[string]any {
	out := maps.Clone(base)
	maps.Copy(out, extra)
	return out
}

func TestBuild(t *testing.T) {
	war := registration(t, fixtures.AWSIdentity("i-1234567890abcdef0"), "virtual-machines")
	own := identity(t, war)
	if got := own["LABELS"].(map[string]any); got["app"] != fixtures.GroupName || got["class"] != "vm" {
		t.Fatalf("the WorkloadEntry's labels %v lack the template's app=ratings, class=vm", got)
	}
	proxyConfig := map[string]any{"discoveryAddress": "embark:15012", "proxyMetadata": map[string]any{"X": "y"}}
	tests := []struct {
		name    string
		sidecar map[string]any
		want    map[string]any // metadata; nil when wantErr
		wantErr string         // the key ErrMetadata names
	}{
		{
			name: "pilot-agent's node: identity replaced, harmless keys kept, the rest dropped",
			sidecar: map[string]any{
				"PROXY_CONFIG": proxyConfig, "ISTIO_VERSION": "1.30.0", "INTERCEPTION_MODE": "NONE", "DNS_CAPTURE": "true",
				"DNS_AUTO_ALLOCATE": "false", "HTTP10": "1", "ENVOY_STATUS_PORT": 15021, "ENVOY_PROMETHEUS_PORT": 15090,
				"NAMESPACE": "bookinfo", "SERVICE_ACCOUNT": fixtures.ServiceAccount, "CLUSTER_ID": "Kubernetes", "NETWORK": "virtual-machines",
				"INSTANCE_IPS": "10.0.0.5,172.17.0.1", "LABELS": map[string]any{"app": "ratings", "version": "v1"},
				"WORKLOAD_NAME": "ratings-vm-1", "NAME": "ratings-vm-1", "OWNER": "x", "MESH_ID": "cluster.local", "PILOT_SAN": []any{"istiod"},
				"STATIC_LABELS": map[string]any{"app": "ratings"}, "GENERATOR": "grpc", "AUTO_REGISTER_GROUP": "ratings", "WORKLOAD_ENTRY": "ratings-vm-1",
			},
			want: with(own, map[string]any{
				"PROXY_CONFIG": proxyConfig, "ISTIO_VERSION": "1.30.0", "INTERCEPTION_MODE": "NONE", "DNS_CAPTURE": "true",
				"DNS_AUTO_ALLOCATE": "false", "HTTP10": "1", "ENVOY_STATUS_PORT": 15021.0, "ENVOY_PROMETHEUS_PORT": 15090.0,
			}),
		},
		{
			name: "metadata claiming another workload",
			sidecar: map[string]any{
				"LABELS": map[string]any{"app": "reviews", "istio.io/test-vm": "true"}, "STATIC_LABELS": map[string]any{"app": "reviews"},
				"INSTANCE_IPS": "10.2.0.3", "NAMESPACE": "payments", "SERVICE_ACCOUNT": "payments", "CLUSTER_ID": "remote",
				"NETWORK": "vpc-2", "WORKLOAD_NAME": "reviews", "NODE_NAME": "node-1", "ANNOTATIONS": map[string]any{"a": "b"},
				"PLATFORM_METADATA": map[string]any{"aws_region": "eu-west-1"}, "REQUESTED_NETWORK_VIEW": "vpc-2", "POD_PORTS": "[]",
				"credential": "true", "ISTIO_META_X": "y",
			},
			want: own,
		},
		{name: "no metadata", want: own},
		{name: "DNS_CAPTURE a JSON bool", sidecar: map[string]any{"DNS_CAPTURE": true}, wantErr: "DNS_CAPTURE"},
		{name: "DNS_CAPTURE not a bool", sidecar: map[string]any{"DNS_CAPTURE": "maybe"}, wantErr: "DNS_CAPTURE"},
		{name: "ENVOY_STATUS_PORT a string", sidecar: map[string]any{"ENVOY_STATUS_PORT": "15021"}, wantErr: "ENVOY_STATUS_PORT"},
		{name: "ENVOY_STATUS_PORT a fraction", sidecar: map[string]any{"ENVOY_STATUS_PORT": 150.5}, wantErr: "ENVOY_STATUS_PORT"},
		{name: "ENVOY_PROMETHEUS_PORT out of range", sidecar: map[string]any{"ENVOY_PROMETHEUS_PORT": 70000}, wantErr: "ENVOY_PROMETHEUS_PORT"},
		{name: "PROXY_CONFIG a string", sidecar: map[string]any{"PROXY_CONFIG": "{}"}, wantErr: "PROXY_CONFIG"},
		{name: "ISTIO_VERSION a number", sidecar: map[string]any{"ISTIO_VERSION": 1.3}, wantErr: "ISTIO_VERSION"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := Build(sidecarNode(t, tt.sidecar), war, "Kubernetes")
			if tt.wantErr != "" {
				if !errors.Is(err, ErrMetadata) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrMetadata naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := n.GetMetadata().AsMap(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("metadata\n got %v\nwant %v", got, tt.want)
			}
			if n.GetId() != sidecarID || n.GetCluster() != "ratings.bookinfo" || n.GetUserAgentName() != "envoy" {
				t.Errorf("node %v: want the sidecar's ID, cluster and user agent", n)
			}
			if want := (&core.Locality{Region: fixtures.Region, Zone: fixtures.Zone}); !proto.Equal(n.GetLocality(), want) {
				t.Errorf("locality %v, want the registration's %v, not the sidecar's", n.GetLocality(), want)
			}
		})
	}
}

func TestBuildWithoutLocalityOrNetwork(t *testing.T) {
	war := registration(t, runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Issuer: "https://idp", Subject: "vm-1"}}, "")
	n, err := Build(sidecarNode(t, map[string]any{"NETWORK": "vpc-2"}), war, "Kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	if n.GetLocality() != nil {
		t.Errorf("locality %v, want none: a JWT host has no known locality, and the sidecar's is not taken", n.GetLocality())
	}
	if v, ok := n.GetMetadata().GetFields()[KeyNetwork]; ok {
		t.Errorf("NETWORK %v, want none: the group sets no network", v)
	}
}

func TestBuildRefusesABrokenSnapshot(t *testing.T) {
	war := registration(t, fixtures.AWSIdentity("i-1234567890abcdef0"), "virtual-machines")
	war.Spec.WorkloadGroup.Spec.Raw = []byte("{")
	if _, err := Build(sidecarNode(t, nil), war, "Kubernetes"); err == nil || errors.Is(err, ErrMetadata) {
		t.Fatalf("err = %v, want an error about the registration's snapshot", err)
	}
}

// FuzzBuild: whatever node a sidecar sends (decoded from any bytes), Build
// never panics, and what it returns carries the registration's identity
// and no metadata key but PassThrough's and the identity keys.
func FuzzBuild(f *testing.F) {
	seed, _ := proto.Marshal(sidecarNode(f, map[string]any{
		"LABELS": map[string]any{"istio.io/test-vm": "true"}, "INSTANCE_IPS": "10.2.0.3", "DNS_CAPTURE": "true", "ENVOY_STATUS_PORT": 15021,
		"PROXY_CONFIG": map[string]any{}, "GENERATOR": "api",
	}))
	f.Add(seed)
	f.Add([]byte{})
	war := registration(f, fixtures.AWSIdentity("i-1234567890abcdef0"), "virtual-machines")
	own := identity(f, war)
	f.Fuzz(func(t *testing.T, wire []byte) {
		sidecar := &core.Node{}
		if proto.Unmarshal(wire, sidecar) != nil {
			return
		}
		n, err := Build(sidecar, war, "Kubernetes")
		if err != nil {
			if !errors.Is(err, ErrMetadata) {
				t.Fatalf("Build: %v, want only ErrMetadata errors", err)
			}
			return
		}
		got := n.GetMetadata().AsMap()
		for k, v := range own {
			if !reflect.DeepEqual(got[k], v) {
				t.Fatalf("%s = %v, want the registration's %v", k, got[k], v)
			}
		}
		for k := range got {
			_, identityKey := own[k]
			if _, harmless := PassThrough[k]; !identityKey && !harmless {
				t.Fatalf("metadata key %s passed through", k)
			}
		}
	})
}
