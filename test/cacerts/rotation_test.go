package cacerts

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/meshkit"
	"github.com/embark-mesh/embark/test/testenv"
)

// shortTTL is the workload certificate lifetime the VM's pilot-agent asks
// for (SECRET_TTL): it renews at about half of it, so several times during
// the rotations.
const shortTTL = 30 * time.Second

// sampleEvery is how often both sides' certificates are checked against the
// other side's trust bundle during the rotations.
const sampleEvery = 200 * time.Millisecond

// A plugged-in CA (root R1, intermediate I1) has its intermediate rotated
// (I2 under R1), then its root rotated with overlap: root-cert.pem becomes
// R1+R2, istiod signs with I3 under R2, then root-cert.pem becomes R2
// alone. istiod reloads its cacerts files each time (no restart). The
// VM's real pilot-agent, onboarded through Embark, gets certificates
// through each new intermediate and the new trust bundle through Embark,
// with no re-onboarding: same registration, AgentConnected and the ADS
// stream to Embark unchanged. Throughout, every 200 ms, the VM's current
// certificate verifies against the bundle pods hold (ConfigMap
// istio-ca-root-cert of the namespace) and istiod's current serving
// certificate (issued at once by the current signing CA: what a pod that
// just renewed presents) verifies against the VM's ROOTCA bundle (what
// pilot-agent serves over SDS, read from SDS streams as Envoy holds them).
//
// pilot-agent as Embark's cluster.env runs it takes its roots from the
// CA's answer, so a VM gets a new bundle with its next certificate; with
// PROXY_CONFIG_XDS_AGENT=true it also takes the trust bundle istiod pushes
// over PCDS (ISTIO_MULTIROOT_MESH), which Embark relays: the second case.
// Each case rotates from where the previous one left the CA.
func TestPluggedCARotationWithoutDistrust(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		vm   int
	}{
		{name: "roots with the next certificate", vm: 21},
		{name: "roots pushed over PCDS", env: map[string]string{"PROXY_CONFIG_XDS_AGENT": "true"}, vm: 22},
	} {
		t.Run(tc.name, func(t *testing.T) { rotateUnderVM(t, tc.env, tc.vm) })
	}
}

// rotateUnderVM onboards VM n (its pilot-agent with agentEnv besides
// SECRET_TTL) and rotates the plugged-in CA's intermediate, then its root,
// under it.
func rotateUnderVM(t *testing.T, agentEnv map[string]string, n int) {
	ns := env.Namespace(t)
	wg := fixtures.WorkloadGroup(ns, map[string]string{"app": "ratings"})
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	ep := startEndpoint(t, ns)
	vm := register(t, wg, n)
	aenv := map[string]string{"SECRET_TTL": shortTTL.String()}
	maps.Copy(aenv, agentEnv)
	agent := meshkit.StartSidecar(t, ep.xds, ep.rootFile, vm.VM, istioagent.Options{
		EnvoyStandIn: true,
		Env:          aenv,
	})
	// The sidecar's ADS stream to Embark, through pilot-agent's xDS proxy.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ads, lds := meshkit.Listeners(t, ctx, agent)
	before := waitAgentConnected(t, vm.Key)
	node, err := agent.Node()
	if err != nil {
		t.Fatal(err)
	}

	w := &watcher{agent: agent, ns: ns, embarkRoots: ep.istiodRoots,
		workload: watchSDS(t, agent, node, "default"), roots: watchSDS(t, agent, node, "ROOTCA")}
	// R1 and I1 are the CA as this case finds it; it leaves R2 and I3.
	r1, i1 := plugged.root, plugged.inter
	w.waitFor(t, "the VM's first certificate through the current intermediate", func(s *snapshot) bool {
		return s.vmSignedBy(i1) && verifyChain(s.vm, []*x509.Certificate{r1.cert}) == nil
	})
	stop := w.sample(t)

	i2 := mustAuthority(t, "intermediate after "+i1.cert.Subject.CommonName, r1)
	r2 := mustAuthority(t, "root after "+r1.cert.Subject.CommonName, nil)
	i3 := mustAuthority(t, "intermediate under "+r2.cert.Subject.CommonName, r2)
	steps := []struct {
		name  string
		write func() error
		done  func(*snapshot) bool
	}{{
		name:  "intermediate: a new one under the same root",
		write: func() error { return writeCACerts(cacertsDir, i2, r1) },
		done:  func(s *snapshot) bool { return s.vmSignedBy(i2) && s.istiodSignedBy(i2) },
	}, {
		name:  "root-cert.pem: the old and the new root (signing under the old)",
		write: func() error { return writeCACerts(cacertsDir, i2, r1, r1, r2) },
		done: func(s *snapshot) bool {
			return holds(s.vmRoots, r1) && holds(s.vmRoots, r2) && holds(s.podRoots, r1) && holds(s.podRoots, r2)
		},
	}, {
		name:  "signing: an intermediate under the new root (both roots trusted)",
		write: func() error { return writeCACerts(cacertsDir, i3, r2, r1, r2) },
		done:  func(s *snapshot) bool { return s.vmSignedBy(i3) && s.istiodSignedBy(i3) },
	}, {
		name:  "root-cert.pem: the new root alone",
		write: func() error { return writeCACerts(cacertsDir, i3, r2, r2) },
		done: func(s *snapshot) bool {
			return len(s.vmRoots) == 1 && holds(s.vmRoots, r2) && len(s.podRoots) == 1 && holds(s.podRoots, r2)
		},
	}}
	for _, st := range steps {
		start := time.Now()
		if err := st.write(); err != nil {
			t.Fatal(err)
		}
		w.waitFor(t, st.name, st.done)
		t.Logf("%s: reached by the VM %s after the files changed", st.name, time.Since(start).Round(100*time.Millisecond))
	}
	plugged.root, plugged.inter = r2, i3
	stats := stop()
	t.Logf("%d samples of both sides during the rotations (%d unreadable)", stats.samples, stats.unreadable)
	if stats.samples < 10 {
		t.Errorf("only %d samples during the rotations", stats.samples)
	}
	for i, v := range stats.violations {
		if i == 5 {
			t.Errorf("... and %d more", len(stats.violations)-5)
			break
		}
		t.Errorf("window of distrust at %s: %s", v.at.Format(time.StampMilli), v.what)
	}

	// No re-onboarding: the same registration, connected all along over the
	// same ADS stream, which still answers.
	after := waitAgentConnected(t, vm.Key)
	if after.uid != before.uid {
		t.Errorf("the registration was re-created during the rotations: UID %s, then %s", before.uid, after.uid)
	}
	if !after.cond.LastTransitionTime.Equal(&before.cond.LastTransitionTime) || after.cond.Reason != before.cond.Reason {
		t.Errorf("AgentConnected changed during the rotations: %+v, then %+v", before.cond, after.cond)
	}
	if !after.connectedAt.Equal(before.connectedAt) || after.disconnected {
		t.Errorf("the ADS stream to Embark was re-established during the rotations: connected at %v, then %v (disconnected: %v)", before.connectedAt, after.connectedAt, after.disconnected)
	}
	if err := ads.Send(resource.ListenerType, nil, lds.GetVersionInfo(), lds.GetNonce()); err != nil {
		t.Errorf("the ADS stream after the rotations: %v", err)
	}
}

func mustAuthority(t *testing.T, cn string, parent *authority) *authority {
	t.Helper()
	a, err := newAuthority(cn, parent)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// snapshot is both sides' certificates and trust bundles at one moment.
type snapshot struct {
	vm       []*x509.Certificate // the VM's workload certificate chain
	vmRoots  []*x509.Certificate // the VM's ROOTCA bundle
	podRoots []*x509.Certificate // ConfigMap istio-ca-root-cert of the namespace
	istiod   []*x509.Certificate // istiod's serving certificate chain
}

func (s *snapshot) vmSignedBy(a *authority) bool { return s.vm[0].CheckSignatureFrom(a.cert) == nil }

func (s *snapshot) istiodSignedBy(a *authority) bool {
	return s.istiod[0].CheckSignatureFrom(a.cert) == nil
}

// watcher reads both sides of the trust relation.
type watcher struct {
	agent *istioagent.Agent
	ns    string
	// embarkRoots is Embark's istiod.rootCertFile: the watcher copies the
	// namespace's istio-ca-root-cert into it when it changes, as the
	// kubelet updates a mounted ConfigMap.
	embarkRoots string
	// workload and roots are the VM's SDS secrets default and ROOTCA.
	workload, roots *sdsSecret

	mu       sync.Mutex
	mirrored string
}

func (w *watcher) read(ctx context.Context) (*snapshot, error) {
	var s snapshot
	workload, err := w.workload.last()
	if err != nil {
		return nil, fmt.Errorf("SDS default: %w", err)
	}
	if s.vm, err = parsePEM(workload.GetTlsCertificate().GetCertificateChain().GetInlineBytes()); err != nil {
		return nil, fmt.Errorf("SDS default: %w", err)
	}
	roots, err := w.roots.last()
	if err != nil {
		return nil, fmt.Errorf("SDS ROOTCA: %w", err)
	}
	if s.vmRoots, err = parsePEM(roots.GetValidationContext().GetTrustedCa().GetInlineBytes()); err != nil {
		return nil, fmt.Errorf("SDS ROOTCA: %w", err)
	}
	var cm corev1.ConfigMap
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: w.ns, Name: "istio-ca-root-cert"}, &cm); err != nil {
		return nil, fmt.Errorf("pod trust bundle: %w", err)
	}
	if s.podRoots, err = parsePEM([]byte(cm.Data["root-cert.pem"])); err != nil {
		return nil, fmt.Errorf("pod trust bundle: %w", err)
	}
	if err := w.mirror(cm.Data["root-cert.pem"]); err != nil {
		return nil, err
	}
	if s.istiod, err = istiodChain(ctx); err != nil {
		return nil, err
	}
	return &s, nil
}

func (w *watcher) mirror(roots string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if roots == w.mirrored {
		return nil
	}
	if err := os.WriteFile(w.embarkRoots, []byte(roots), 0o600); err != nil {
		return fmt.Errorf("update Embark's istiod roots: %w", err)
	}
	w.mirrored = roots
	return nil
}

// istiodChain is the certificate chain istiod serves on its secure gRPC
// port.
func istiodChain(ctx context.Context) ([]*x509.Certificate, error) {
	d := tls.Dialer{Config: &tls.Config{ServerName: testenv.IstiodServerName, NextProtos: []string{"h2"},
		InsecureSkipVerify: true, // the test verifies the chain itself, against the VM's bundle
	}}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", istiod.SecureGRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("istiod's serving certificate: %w", err)
	}
	defer conn.Close()
	chain := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(chain) == 0 {
		return nil, errors.New("istiod's serving certificate: none")
	}
	return chain, nil
}

// waitFor waits until done holds for a snapshot: at most a few renewals.
func (w *watcher) waitFor(t *testing.T, what string, done func(*snapshot) bool) {
	t.Helper()
	var last *snapshot
	var lastErr error
	err := wait.PollUntilContextTimeout(t.Context(), sampleEvery, 3*shortTTL, true, func(ctx context.Context) (bool, error) {
		s, err := w.read(ctx)
		if err != nil {
			lastErr = err
			return false, nil
		}
		last = s
		return done(s), nil
	})
	if err != nil {
		t.Fatalf("%s: not reached within %s (last read error: %v)\nlast snapshot: %s\npilot-agent log:\n%s\nistiod log:\n%s",
			what, 3*shortTTL, lastErr, last, meshkit.Tail(w.agent.Logs()), grepLog(istiod.Log(), "cacerts", "ROOT-CA", "intermediate", "Plug-in"))
	}
}

func (s *snapshot) String() string {
	if s == nil {
		return "none"
	}
	names := func(cs []*x509.Certificate) string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Subject.CommonName+" (issuer "+c.Issuer.CommonName+")")
		}
		return strings.Join(n, ", ")
	}
	return fmt.Sprintf("VM chain [%s], VM roots [%s], pod roots [%s], istiod chain [%s]", names(s.vm), names(s.vmRoots), names(s.podRoots), names(s.istiod))
}

func grepLog(log string, words ...string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return meshkit.Tail(strings.Join(out, "\n"))
}

// violation is a moment when one side did not trust the other's
// certificate.
type violation struct {
	at   time.Time
	what string
}

type sampleStats struct {
	samples, unreadable int
	violations          []violation
}

// sample checks both sides against each other every sampleEvery until the
// returned function is called, which returns what it saw.
func (w *watcher) sample(t *testing.T) func() sampleStats {
	t.Helper()
	return sampleUntilStopped(t, func(ctx context.Context) ([]string, error) {
		s, err := w.read(ctx)
		if err != nil {
			return nil, err
		}
		var found []string
		if err := verifyChain(s.vm, s.podRoots); err != nil {
			found = append(found, fmt.Sprintf("the VM's certificate is not trusted by pods: %v (%s)", err, s))
		}
		if err := verifyChain(s.istiod, s.vmRoots); err != nil {
			found = append(found, fmt.Sprintf("istiod's certificate is not trusted by the VM: %v (%s)", err, s))
		}
		return found, nil
	})
}

// sampleUntilStopped calls check every sampleEvery, in a goroutine of its own,
// until the returned function is called (at the latest when the test
// ends), which returns what the checks saw: a sample that could not be
// read (check's error) counts as unreadable, each message it returns as a
// violation at that moment.
func sampleUntilStopped(t *testing.T, check func(context.Context) ([]string, error)) func() sampleStats {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var stats sampleStats
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			found, err := check(ctx)
			if err != nil {
				if ctx.Err() == nil {
					stats.unreadable++
				}
				continue
			}
			stats.samples++
			now := time.Now()
			for _, what := range found {
				stats.violations = append(stats.violations, violation{now, what})
			}
		}
	}()
	var once sync.Once
	stop := func() sampleStats {
		once.Do(func() { cancel(); <-done })
		return stats
	}
	t.Cleanup(func() { stop() })
	return stop
}

// connection is what the registration records of the workload's
// connection.
type connection struct {
	uid          types.UID
	cond         metav1.Condition
	connectedAt  *metav1.Time
	disconnected bool
}

// waitAgentConnected waits for the registration key to be AgentConnected
// and returns what it records.
func waitAgentConnected(t *testing.T, key client.ObjectKey) connection {
	t.Helper()
	var c connection
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := env.Client.Get(ctx, key, war); err != nil {
			return false, nil
		}
		cond := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
		if cond == nil || cond.Status != metav1.ConditionTrue || war.Status.Connection == nil {
			return false, nil
		}
		c = connection{uid: war.UID, cond: *cond, connectedAt: war.Status.Connection.ConnectedAt, disconnected: war.Status.Connection.DisconnectedAt != nil}
		return true, nil
	})
	if err != nil {
		t.Fatalf("registration %s never AgentConnected: %v", key, err)
	}
	return c
}
