// Command demo runs Embark locally, as `make demo` does: a real
// kube-apiserver + etcd with Embark's and Istio's CRDs, the onboarding
// endpoint serving over TLS, the seed 004 bookinfo WorkloadGroup,
// OnboardingPolicies and Sidecar, and simulated EC2 instances (loopback IMDS
// and STS with a demo AWS certificate) that onboard through the endpoint's
// API exactly as the onboarding agent does. It prints what a user would see,
// then keeps everything running until Ctrl-C (or exits at once when CI=true
// or standard input is not a terminal). A failed step says which and why,
// and the exit code is non-zero.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/test/testenv"
)

const endpointHost = "onboarding-endpoint.demo.embark"

func main() {
	// Libraries that log through controller-runtime's logger: keep them quiet.
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Println("Embark demo: onboarding simulated EC2 instances into a local control plane")
	if err := run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo FAILED: %v\n", err)
		os.Exit(1)
	}
}

// step prints a numbered step and runs it; a failure names the step.
type stepper struct{ n int }

func (s *stepper) do(title string, fn func() error) error {
	s.n++
	fmt.Printf("\n==> [%d] %s\n", s.n, title)
	if err := fn(); err != nil {
		return fmt.Errorf("step %d (%s): %w", s.n, title, err)
	}
	return nil
}

func run(ctx context.Context) error {
	var (
		st   stepper
		env  *testenv.Env
		work string
		err  error
	)
	interactive := os.Getenv("CI") != "true" && isTerminal(os.Stdin)
	if work, err = os.MkdirTemp("", "embark-demo-"); err != nil {
		return err
	}
	defer os.RemoveAll(work)

	if err := st.do("start a local kube-apiserver + etcd with Embark's and Istio's CRDs", func() error {
		env, err = testenv.Start(testenv.Options{GarbageCollector: true})
		return err
	}); err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	kubectl := func(stdin []byte, args ...string) (string, error) { return env.Kubectl(ctx, stdin, args...) }
	show := func(args ...string) error {
		fmt.Printf("$ kubectl %s\n", strings.Join(args, " "))
		out, err := kubectl(nil, args...)
		fmt.Print(indent(out))
		return err
	}

	if err := st.do("create the bookinfo namespace, the seed 004 WorkloadGroup, OnboardingPolicies and Sidecar", func() error {
		root, err := testenv.RepoRoot()
		if err != nil {
			return err
		}
		for _, ns := range []string{"bookinfo", "istio-system"} {
			if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				return err
			}
		}
		if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm", Namespace: "bookinfo"}}); err != nil {
			return err
		}
		out, err := kubectl(nil, "apply", "-f", filepath.Join(root, "api/crds/testdata/seed004/workloadgroup.yaml"),
			"-f", filepath.Join(root, "api/crds/testdata/seed004/policy-narrow-ec2-subset.yaml"),
			"-f", filepath.Join(root, "api/crds/testdata/seed004/sidecar.yaml"))
		fmt.Print(indent(out))
		return err
	}); err != nil {
		return err
	}

	// Simulated AWS: one region's demo certificate, STS, and EC2 instances.
	var (
		aws       = &simulatedAWS{}
		instances []*awstest.IMDS
		denied    *awstest.IMDS
	)
	defer aws.close()
	if err := st.do("simulate AWS us-east-2: a demo region certificate, STS, and EC2 instances with IMDS", func() error {
		if aws.ca, err = awstest.NewCA("us-east-2"); err != nil {
			return err
		}
		aws.sts = awstest.NewSTS()
		for i, ip := range []string{"172.31.5.254", "172.31.7.21", "172.31.9.40"} {
			inst := awstest.Instance{Role: "ratings-role", PrivateIP: ip}
			if i > 0 {
				inst.InstanceID = fmt.Sprintf("i-0de%014d", i)
			}
			m, err := aws.instance(inst)
			if err != nil {
				return err
			}
			instances = append(instances, m)
		}
		// An instance of an account no policy allows.
		if denied, err = aws.instance(awstest.Instance{Account: "999999999999", Role: "ratings-role", PrivateIP: "172.31.3.3", InstanceID: "i-0de99999999999999"}); err != nil {
			return err
		}
		for _, m := range append(instances, denied) {
			in := m.Instance()
			fmt.Printf("    %s  account %s  zone %s  role %s  IMDS %s\n", in.InstanceID, in.Account, in.Zone, in.Role, m.URL)
		}
		return nil
	}); err != nil {
		return err
	}

	endpointDone := make(chan error, 1)
	// The endpoint stops before the control plane does (defers run last first).
	endpointCtx, stopEndpoint := context.WithCancel(ctx)
	defer func() {
		stopEndpoint()
		select {
		case <-endpointDone:
		case <-time.After(30 * time.Second):
		}
	}()
	var (
		pool           *x509.CertPool
		onboardingAddr string
		metricsAddr    string
	)
	if err := st.do("start the onboarding endpoint (TLS, demo certificate, demo AWS trust)", func() error {
		certFile, keyFile, p, err := writeServingCert(work)
		if err != nil {
			return err
		}
		pool = p
		certs := filepath.Join(work, "aws-certs")
		if err := os.MkdirAll(certs, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(certs, "us-east-2.pem"), aws.ca.CertificatePEM(), 0o644); err != nil {
			return err
		}
		onboardingAddr, metricsAddr = freeAddr(), freeAddr()
		cfg := fmt.Sprintf(`apiVersion: config.onboarding.tetrate.io/v1alpha1
kind: OnboardingEndpointConfiguration
endpoint:
  hosts: [%s]
  certFile: %s
  keyFile: %s
identity:
  aws:
    certificatesDir: %s
    stsEndpoint: %s
registration:
  gracePeriod: 30s
listen:
  onboarding: %s
  metrics: %s
  xds: %s
`, endpointHost, certFile, keyFile, certs, aws.sts.URL, onboardingAddr, metricsAddr, freeAddr())
		cfgFile := filepath.Join(work, "endpoint.yaml")
		if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
			return err
		}
		ready := make(chan struct{})
		logFile, err := os.Create(filepath.Join(work, "endpoint.log"))
		if err != nil {
			return err
		}
		go func() {
			endpointDone <- app.Run(endpointCtx, app.Options{ConfigFile: cfgFile, Kubeconfig: env.KubeconfigPath, Replica: "embark-demo-0",
				Logger: slog.New(slog.NewTextHandler(logFile, nil)), Ready: ready})
		}()
		select {
		case <-ready:
			fmt.Printf("    onboarding API https://%s (as %s), metrics http://%s/metrics\n", onboardingAddr, endpointHost, metricsAddr)
			return nil
		case err := <-endpointDone:
			return fmt.Errorf("endpoint stopped: %w", err)
		case <-time.After(2 * time.Minute):
			return errors.New("endpoint not ready within 2 minutes")
		}
	}); err != nil {
		return err
	}

	conn, err := grpc.NewClient(onboardingAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: endpointHost})))
	if err != nil {
		return err
	}
	defer conn.Close()
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)

	var first string
	if err := st.do("onboard the EC2 instances: IMDS document + signature, signed STS proof, Authorize, Register", func() error {
		for _, m := range instances {
			name, err := onboard(ctx, api, aws, m)
			if err != nil {
				return fmt.Errorf("%s: %w", m.Instance().InstanceID, err)
			}
			if first == "" {
				first = name
			}
			fmt.Printf("    %s registered as bookinfo/%s\n", m.Instance().InstanceID, name)
		}
		return nil
	}); err != nil {
		return err
	}

	if err := st.do("list the onboarded workloads", func() error {
		if err := show("get", "war", "-A"); err != nil {
			return err
		}
		return show("get", "workloadentries", "-n", "bookinfo", "-o", "custom-columns=NAME:.metadata.name,ADDRESS:.spec.address,NETWORK:.spec.network,LOCALITY:.spec.locality,SERVICEACCOUNT:.spec.serviceAccount")
	}); err != nil {
		return err
	}
	if err := st.do("describe one registration", func() error { return show("describe", "war", "-n", "bookinfo", first) }); err != nil {
		return err
	}
	if err := st.do("an instance of an account no OnboardingPolicy allows is refused", func() error {
		_, err := onboard(ctx, api, aws, denied)
		if err == nil {
			return errors.New("the instance was onboarded, but no policy allows its account")
		}
		fmt.Printf("    %s: %v\n", status.Code(err), status.Convert(err).Message())
		return show("get", "events", "-n", "bookinfo", "--field-selector", "reason=OnboardingDenied", "-o", "custom-columns=TYPE:.type,REASON:.reason,OBJECT:.involvedObject.name,COUNT:.count")
	}); err != nil {
		return err
	}
	if err := st.do("check what was shown", func() error {
		out, err := kubectl(nil, "get", "war", "-A", "--no-headers")
		if err != nil {
			return err
		}
		if n := len(strings.Split(strings.TrimSpace(out), "\n")); n != len(instances) {
			return fmt.Errorf("%d registrations listed, want %d", n, len(instances))
		}
		fmt.Printf("    %d registrations, 1 refusal, as expected\n", len(instances))
		return nil
	}); err != nil {
		return err
	}

	fmt.Println("\nNot in this demo yet: sidecars (pilot-agent) connecting over xDS (AgentConnected, istioctl proxy-status),")
	fmt.Println("health mirroring and grace-period removal shown live; the xDS server and sweeper run already.")
	if !interactive {
		fmt.Println("\ndemo: done (non-interactive: not waiting for Ctrl-C)")
		return nil
	}
	fmt.Printf("\nEmbark is running. Try:\n    kubectl --kubeconfig %s get war -A\n    curl -s http://%s/metrics | grep embark_\nPress Ctrl-C to stop and clean up.\n", env.KubeconfigPath, metricsAddr)
	select {
	case <-ctx.Done():
	case err := <-endpointDone:
		return fmt.Errorf("endpoint stopped: %w", err)
	}
	fmt.Println("\ncleaning up")
	return nil
}

// onboard does what the onboarding agent on instance m does.
func onboard(ctx context.Context, api onboardingv1alpha1.OnboardingServiceClient, aws *simulatedAWS, m *awstest.IMDS) (string, error) {
	ic := imds.New(imds.Options{Endpoint: m.URL})
	sc := awsclient.NewSTSClient(ic, m.Instance().Region, func(o *sts.Options) { o.BaseEndpoint = &aws.sts.URL })
	cred, err := awsclient.Credential(ctx, ic, sc, endpointHost)
	if err != nil {
		return "", fmt.Errorf("read the platform credential: %w", err)
	}
	ac := endpoint.AWSCredentialToProto(cred)
	auth, err := api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: "bookinfo", Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: ac},
	})
	if err != nil {
		return "", err
	}
	reg, err := api.Register(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
		Addresses:           []*onboardingv1alpha1.HostAddress{{Ip: m.Instance().PrivateIP, Type: "VPC"}},
		ConnectedOver:       "VPC",
		AgentVersion:        "v0.1.0-demo",
		IstioSidecarVersion: "1.30-dev",
		Labels:              map[string]string{"version": "v5"},
	})
	if err != nil {
		return "", err
	}
	return reg.GetRegistrationName(), nil
}

// simulatedAWS is one AWS region on loopback: its demo certificate, STS, and
// the IMDS of each instance.
type simulatedAWS struct {
	ca   *awstest.CA
	sts  *awstest.STS
	imds []*awstest.IMDS
}

func (a *simulatedAWS) instance(inst awstest.Instance) (*awstest.IMDS, error) {
	m, err := awstest.NewIMDS(a.ca, inst, awstest.WithRoleCredentialsFrom(a.sts))
	if err != nil {
		return nil, err
	}
	a.imds = append(a.imds, m)
	return m, nil
}

func (a *simulatedAWS) close() {
	for _, m := range a.imds {
		m.Close()
	}
	if a.sts != nil {
		a.sts.Close()
	}
}

// writeServingCert writes a demo CA-signed serving certificate for
// endpointHost and returns the files and a pool trusting the CA.
func writeServingCert(dir string) (certFile, keyFile string, pool *x509.CertPool, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Embark demo CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: endpointHost}, DNSNames: []string{endpointHost},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", nil, err
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", nil, err
	}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return certFile, keyFile, pool, nil
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer l.Close()
	return l.Addr().String()
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
