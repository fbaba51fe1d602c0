package benchkit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/nodeid"
)

// Workload is one registered workload: its registration's key, its sidecar
// token, the node ID its sidecar presents and the UIDs of its registration
// and WorkloadEntry.
type Workload struct {
	Key    ktypes.NamespacedName
	Token  string
	NodeID string
	UIDs   [2]ktypes.UID // registration, WorkloadEntry
}

// RatingsGroup creates, in namespace ns, the WorkloadGroup "ratings" (label
// app=ratings, service account ratings-vm) the benchmarks register their
// workloads in, and that service account, and returns the group.
func RatingsGroup(ctx context.Context, c client.Client, ns string) (*istionetworkingv1.WorkloadGroup, error) {
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns}}
	wg.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": "ratings"}, ServiceAccount: "ratings-vm"}
	if err := c.Create(ctx, wg); err != nil {
		return nil, fmt.Errorf("create WorkloadGroup: %w", err)
	}
	if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm", Namespace: ns}}); err != nil {
		return nil, fmt.Errorf("create ServiceAccount: %w", err)
	}
	return wg, nil
}

// IP is the address of the i-th workload, unique for i below 100 x 65,536:
// 10.100.0.0 onwards.
func IP(i int) string {
	return fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256)
}

// Registration says what Register registers.
type Registration struct {
	// Registrar registers each workload (its write budget is the caller's).
	Registrar *registry.Registrar
	// Group is the WorkloadGroup the workloads join.
	Group *istionetworkingv1.WorkloadGroup
	// N is how many workloads.
	N int
	// Workers is how many register at a time; default 8.
	Workers int
	// IP is the address of the i-th workload; default IP.
	IP func(i int) string
}

// Register registers r.N EC2 workloads through the registry's own Write,
// r.Workers at a time so that the API server, not the client's round trips,
// is the limit, and returns them in order. It stops at the first error.
func Register(ctx context.Context, r Registration) ([]*Workload, error) {
	if r.Workers <= 0 {
		r.Workers = 8
	}
	if r.IP == nil {
		r.IP = IP
	}
	ws := make([]*Workload, r.N)
	var next atomic.Int64
	var workers sync.WaitGroup
	errs := make(chan error, r.Workers)
	for range r.Workers {
		workers.Go(func() {
			for i := int(next.Add(1)) - 1; i < r.N; i = int(next.Add(1)) - 1 {
				w, err := registerOne(ctx, r, i)
				if err != nil {
					errs <- err
					return
				}
				ws[i] = w
			}
		})
	}
	workers.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return ws, nil
}

// registerOne registers the i-th workload.
func registerOne(ctx context.Context, r Registration, i int) (*Workload, error) {
	ip := r.IP(i)
	res, err := r.Registrar.Write(ctx, registry.Request{
		Group: r.Group,
		Identity: runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{
			Partition: "aws", Account: "123456789012", Region: "us-east-2", Zone: "us-east-2b",
			EC2: &runtimev1alpha1.EC2Identity{InstanceID: fmt.Sprintf("i-%017x", i)},
		}},
		Registration: runtimev1alpha1.Registration{
			Host:     runtimev1alpha1.HostInfo{Addresses: []runtimev1alpha1.HostAddress{{IP: ip, Type: runtimev1alpha1.AddressTypeVPC}}},
			Settings: runtimev1alpha1.Settings{ConnectedOver: runtimev1alpha1.AddressTypeVPC},
			Sidecar:  runtimev1alpha1.SidecarInfo{Istio: runtimev1alpha1.IstioSidecarInfo{Version: "1.30.0"}},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("register workload %d: %w", i, err)
	}
	key := client.ObjectKeyFromObject(res.Registration)
	return &Workload{Key: key, Token: res.SidecarToken.Token, NodeID: nodeid.Build(ip, key),
		UIDs: [2]ktypes.UID{res.Registration.UID, res.WorkloadEntry.UID}}, nil
}
