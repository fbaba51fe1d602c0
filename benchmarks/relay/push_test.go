package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// defaultPushHosts is -push-hosts' default: a ServiceEntry of that many
// hosts makes istiod push each sidecar a CDS response of about 1 MB (one
// outbound cluster per host; LargePushBytes reports the size measured).
const defaultPushHosts = 1000

// hostsPerEntry is how many hosts one ServiceEntry holds (the CRD allows
// 256).
const hostsPerEntry = 250

// largePush writes ServiceEntries of hosts DNS hosts in all (port 80,
// HTTP; hostsPerEntry each, one after another) in ns, which istiod pushes
// to every held stream as one more cluster per host, and returns the time
// from the first write until the client process saw the last stream ACK a
// CDS response holding them all, and that response's size. The entries
// are deleted again afterwards.
func largePush(b *testing.B, ns string, p *clientProcess, hosts int) (float64, int) {
	b.Helper()
	if _, err := p.do(clientCommand{Op: "arm", MinClusters: hosts}); err != nil {
		b.Fatal(err)
	}
	var entries []*istionetworkingv1.ServiceEntry
	for first := 0; first < hosts; first += hostsPerEntry {
		se := &istionetworkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("large-push-%d", first/hostsPerEntry), Namespace: ns}}
		for k := first; k < min(hosts, first+hostsPerEntry); k++ {
			se.Spec.Hosts = append(se.Spec.Hosts, fmt.Sprintf("svc-%d.large-push.example.com", k))
		}
		se.Spec.Ports = []*istioapi.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}}
		se.Spec.Resolution = istioapi.ServiceEntry_DNS
		se.Spec.Location = istioapi.ServiceEntry_MESH_EXTERNAL
		entries = append(entries, se)
	}
	start := time.Now()
	for _, se := range entries {
		if err := cluster.Env.Client.Create(b.Context(), se); err != nil {
			b.Fatal(err)
		}
	}
	r, err := p.do(clientCommand{Op: "wait-push"})
	if err != nil {
		b.Fatalf("large push of %d hosts: %v", hosts, err)
	}
	for _, se := range entries {
		if err := cluster.Env.Client.Delete(context.WithoutCancel(b.Context()), se); err != nil {
			b.Fatal(err)
		}
	}
	return ms(time.Unix(0, r.LastACK).Sub(start)), r.CDSBytes
}
