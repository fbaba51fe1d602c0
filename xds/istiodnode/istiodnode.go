// Package istiodnode builds the node Embark sends istiod for a sidecar's
// relayed stream (istiod mode).
//
// istiod computes a proxy's configuration from its node: the addresses in
// INSTANCE_IPS find its Service targets (its inbound listeners and
// clusters), LABELS select its Sidecar, EnvoyFilters and policies
// (istio.io/test-vm even makes istiod take them over the registries'),
// NAMESPACE, SERVICE_ACCOUNT, CLUSTER_ID and NETWORK place it. A sidecar's
// node is only what the VM says. So every key istiod derives the workload's
// identity, placement or selection from is built from the registration the
// stream was authenticated for (its token and node ID name it, the node
// ID's address is its proven workload address), through
// registry.BuildWorkloadEntry, so that istiod computes exactly the workload
// the WorkloadEntry describes. From the sidecar's node only its ID, a few
// descriptive fields and an allow-list of metadata keys that shape nothing
// but the VM's own Envoy pass through (PassThrough); everything else it sent
// is dropped. A sidecar's contradicting values (pilot-agent always sends its
// own INSTANCE_IPS, every address of the host, and LABELS) are replaced,
// not refused: see docs/xds.md.
package istiodnode

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
)

// Keys of the node metadata Build sets from the registration, whatever the
// sidecar sent for them.
const (
	KeyNamespace      = "NAMESPACE"
	KeyServiceAccount = "SERVICE_ACCOUNT"
	KeyInstanceIPs    = "INSTANCE_IPS"
	KeyLabels         = "LABELS"
	KeyClusterID      = "CLUSTER_ID"
	KeyNetwork        = "NETWORK"
	KeyWorkloadName   = "WORKLOAD_NAME"
)

// Kind is the form istiod parses a metadata value in
// (pilot/pkg/model.NodeMetadata); a value of another form would make istiod
// refuse the stream, so Build refuses it first, naming the key.
type Kind int

const (
	// String is a JSON string.
	String Kind = iota
	// BoolString is a string strconv.ParseBool accepts (istiod's
	// StringBool).
	BoolString
	// Port is an integral number 0-65535.
	Port
	// Struct is a JSON object.
	Struct
)

// PassThrough are the only metadata keys relayed as the sidecar sent them,
// with the form istiod reads each in. Each shapes only the configuration of
// the VM's own Envoy, which the VM controls anyway (it runs that Envoy); none
// makes istiod compute another workload, select another workload's
// configuration, or serve anything the VM's identity may not have:
//
//   - ISTIO_VERSION: the proxy's version; istiod generates what that version
//     understands (and EnvoyFilters may match it to patch the proxy's own
//     configuration). A false version only gets the VM configuration its
//     Envoy may reject.
//   - PROXY_CONFIG: the proxy's ProxyConfig. istiod reads from it the proxy's
//     own tracing, proxy headers (preserved header case, forwarded client
//     certificate details), private key provider and stats settings, and
//     its presence marks the stream as a proxy's; proxyMetadata is read by
//     pilot-agent only, never by istiod. No field of it names an identity,
//     a namespace, labels or addresses istiod selects by.
//   - INTERCEPTION_MODE: how the VM captures its own traffic (Embark's agent
//     sets NONE); it shapes the VM's own listeners.
//   - DNS_CAPTURE, DNS_AUTO_ALLOCATE: DNS proxying by pilot-agent; istiod
//     then sends the name table of the Services the proxy already sees.
//   - HTTP10: accept HTTP/1.0 on the VM's own outbound listeners.
//   - ENVOY_STATUS_PORT, ENVOY_PROMETHEUS_PORT: the ports of the VM's own
//     Envoy, kept out of its inbound passthrough.
//
// Deliberately dropped, among others: STATIC_LABELS (istiod merges them
// into the proxy's labels), ANNOTATIONS, NODE_NAME and PLATFORM_METADATA
// (topology and platform labels), POD_PORTS (named ports come from the
// WorkloadEntry), GENERATOR (selects istiod's proxyless gRPC or raw config
// ("api") generators), REQUESTED_NETWORK_VIEW, MESH_ID, AUTO_REGISTER_GROUP
// and WORKLOAD_ENTRY (istiod would register or health-check the VM itself;
// the WorkloadEntry is Embark's), and every key an ISTIO_META_* variable on
// the VM makes up (EnvoyFilters may match any metadata key).
var PassThrough = map[string]Kind{
	"ISTIO_VERSION":         String,
	"PROXY_CONFIG":          Struct,
	"INTERCEPTION_MODE":     String,
	"DNS_CAPTURE":           BoolString,
	"DNS_AUTO_ALLOCATE":     BoolString,
	"HTTP10":                String,
	"ENVOY_STATUS_PORT":     Port,
	"ENVOY_PROMETHEUS_PORT": Port,
}

// ErrMetadata is wrapped by Build's errors about the sidecar's metadata.
var ErrMetadata = errors.New("invalid node metadata")

// Build returns the node relayed to istiod for sidecar, the node of the
// first request of a stream authenticated for war (its ID names war, its
// address is war's workload address); clusterID is Embark's configured
// cluster ID. The node ID is the sidecar's; the identity keys (KeyNamespace
// ... KeyWorkloadName) and the locality are war's; of the sidecar's
// metadata only PassThrough keys remain. It fails with ErrMetadata when a
// PassThrough value is not of its Kind.
func Build(sidecar *core.Node, war *runtimev1alpha1.WorkloadAutoRegistration, clusterID string) (*core.Node, error) {
	we, err := registry.BuildWorkloadEntry(war)
	if err != nil {
		return nil, fmt.Errorf("the workload of registration %s/%s: %w", war.Namespace, war.Name, err)
	}
	fields, err := passThrough(sidecar.GetMetadata())
	if err != nil {
		return nil, err
	}
	labels := make(map[string]*structpb.Value, len(we.Spec.Labels))
	for k, v := range we.Spec.Labels {
		labels[k] = structpb.NewStringValue(v)
	}
	set := func(k, v string) {
		if v != "" {
			fields[k] = structpb.NewStringValue(v)
		}
	}
	set(KeyNamespace, war.Namespace)
	set(KeyServiceAccount, we.Spec.ServiceAccount)
	set(KeyInstanceIPs, we.Spec.Address)
	set(KeyClusterID, clusterID)
	set(KeyNetwork, we.Spec.Network)
	// As `istioctl x workload entry configure` sets it: the workload is the
	// group, as a pod's is its Deployment.
	set(KeyWorkloadName, war.Spec.WorkloadGroup.Name)
	fields[KeyLabels] = structpb.NewStructValue(&structpb.Struct{Fields: labels})
	return &core.Node{
		Id:                   sidecar.GetId(),
		Cluster:              sidecar.GetCluster(),
		Metadata:             &structpb.Struct{Fields: fields},
		Locality:             locality(we.Spec.Locality),
		UserAgentName:        sidecar.GetUserAgentName(),
		UserAgentVersionType: sidecar.GetUserAgentVersionType(),
		Extensions:           sidecar.GetExtensions(),
		ClientFeatures:       sidecar.GetClientFeatures(),
	}, nil
}

// passThrough returns the PassThrough fields of md (sharing their values).
func passThrough(md *structpb.Struct) (map[string]*structpb.Value, error) {
	out := make(map[string]*structpb.Value, len(PassThrough)+8)
	for k, kind := range PassThrough {
		v, ok := md.GetFields()[k]
		if !ok {
			continue
		}
		if err := kind.check(v); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrMetadata, k, err)
		}
		out[k] = v
	}
	return out, nil
}

// check reports whether v has kind k.
func (k Kind) check(v *structpb.Value) error {
	switch k {
	case String, BoolString:
		s, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return errors.New("must be a string")
		}
		if k == BoolString {
			if _, err := strconv.ParseBool(s.StringValue); err != nil {
				return fmt.Errorf("must be a string true or false, not %.32q", s.StringValue)
			}
		}
	case Port:
		n, ok := v.GetKind().(*structpb.Value_NumberValue)
		if !ok || n.NumberValue != math.Trunc(n.NumberValue) || n.NumberValue < 0 || n.NumberValue > 65535 {
			return errors.New("must be a port number (an integer 0-65535)")
		}
	case Struct:
		if _, ok := v.GetKind().(*structpb.Value_StructValue); !ok {
			return errors.New("must be an object")
		}
	}
	return nil
}

// locality parses a WorkloadEntry locality (region/zone/subzone); nil when
// there is none. istiod adds the proxy's locality to its labels, so it too
// comes from the registration, never from the sidecar.
func locality(s string) *core.Locality {
	if s == "" {
		return nil
	}
	parts := strings.SplitN(s, "/", 3)
	l := &core.Locality{Region: parts[0]}
	if len(parts) > 1 {
		l.Zone = parts[1]
	}
	if len(parts) > 2 {
		l.SubZone = parts[2]
	}
	return l
}
