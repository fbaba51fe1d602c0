// Package testenv starts the real Kubernetes control plane that Embark's
// integration tests and the demo run against: kube-apiserver and etcd built
// from source by test/tools/install.sh (`make testenv`), optionally
// kube-controller-manager for owner-reference garbage collection, with
// Embark's CRDs and Istio's CRDs (taken from the istio.io/api module) installed.
//
// Start one Env per test package from TestMain (see Main) and isolate tests by
// namespace (Env.Namespace).
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/embark-mesh/embark/api/crds"
)

// Options configures Start. The zero value starts kube-apiserver and etcd with
// every CRD installed and no controllers.
type Options struct {
	// AssetsDir holds the kube-apiserver, etcd and kube-controller-manager
	// binaries. Default: $KUBEBUILDER_ASSETS, else bin/testenv in the
	// repository root.
	AssetsDir string
	// GarbageCollector also runs kube-controller-manager with the garbage
	// collector, namespace and service-account controllers, so that owner
	// references and namespace deletion behave as in a real cluster.
	GarbageCollector bool
	// Scheme for the clients. Default: Scheme().
	Scheme *runtime.Scheme
	// Output receives the control plane's own logs. Default: discarded.
	Output *os.File
	// Restartable keeps etcd's data and the API server's certificates in
	// the Env's own directory, so that StopAPIServer/StartAPIServer and
	// StopEtcd/StartEtcd restart them with the same data, addresses and
	// credentials (Config and KubeconfigPath stay valid), for fault tests.
	Restartable bool
}

// Env is a running control plane.
type Env struct {
	// Config is an admin rest.Config for the API server.
	Config *rest.Config
	// Client is a controller-runtime client (no cache, with Watch) with Scheme.
	Client client.WithWatch
	// Scheme knows Kubernetes', Istio's and Embark's types.
	Scheme *runtime.Scheme
	// KubeconfigPath is an admin kubeconfig file, for kubectl and istioctl.
	KubeconfigPath string

	env     *envtest.Environment
	workDir string
	kcm     *exec.Cmd
	kcmDone chan error
}

// Start starts the control plane and installs the CRDs. The caller must Stop it.
func Start(opts Options) (*Env, error) {
	if opts.Scheme == nil {
		s, err := Scheme()
		if err != nil {
			return nil, err
		}
		opts.Scheme = s
	}
	assets, err := assetsDir(opts.AssetsDir)
	if err != nil {
		return nil, err
	}
	crdList, err := allCRDs()
	if err != nil {
		return nil, err
	}
	workDir, err := os.MkdirTemp("", "embark-testenv-")
	if err != nil {
		return nil, fmt.Errorf("create testenv work dir: %w", err)
	}

	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		Scheme:                opts.Scheme,
		CRDInstallOptions: envtest.CRDInstallOptions{
			CRDs:               crdList,
			ErrorIfPathMissing: true,
		},
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	// The service-account issuer's discovery document names its JWKS at
	// the advertised address: keep it on loopback, where the apiserver
	// serves (by default it is the host's first address, which may not be
	// reachable here), so OIDC discovery against this issuer works.
	te.ControlPlane.GetAPIServer().Configure().Set("advertise-address", "127.0.0.1")
	if opts.Restartable {
		te.ControlPlane.GetAPIServer().CertDir = filepath.Join(workDir, "apiserver")
		// A busy kube-apiserver can take over a minute to drain its
		// watches after SIGTERM; past this it is killed (StopAPIServer).
		te.ControlPlaneStopTimeout = 10 * time.Second
		te.ControlPlane.Etcd = &envtest.Etcd{DataDir: filepath.Join(workDir, "etcd")}
		for _, d := range []string{te.ControlPlane.APIServer.CertDir, te.ControlPlane.Etcd.DataDir} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				_ = os.RemoveAll(workDir)
				return nil, fmt.Errorf("create testenv dir: %w", err)
			}
		}
	}
	if opts.Output != nil {
		te.ControlPlane.GetAPIServer().Out = opts.Output
		te.ControlPlane.GetAPIServer().Err = opts.Output
	}
	cfg, err := te.Start()
	if err != nil {
		_ = os.RemoveAll(workDir)
		return nil, fmt.Errorf("start kube-apiserver and etcd from %s (run `make testenv` to build them): %w", assets, err)
	}
	e := &Env{Config: cfg, Scheme: opts.Scheme, env: te, workDir: workDir}

	e.KubeconfigPath = filepath.Join(workDir, "kubeconfig")
	if err := os.WriteFile(e.KubeconfigPath, te.KubeConfig, 0o600); err != nil {
		_ = e.Stop()
		return nil, fmt.Errorf("write kubeconfig: %w", err)
	}
	e.Client, err = client.NewWithWatch(cfg, client.Options{Scheme: opts.Scheme})
	if err != nil {
		_ = e.Stop()
		return nil, fmt.Errorf("create client: %w", err)
	}
	if opts.GarbageCollector {
		if err := e.startControllerManager(assets, opts.Output); err != nil {
			_ = e.Stop()
			return nil, err
		}
	}
	return e, nil
}

// Stop stops every process of the control plane and removes its files.
func (e *Env) Stop() error {
	var errs []error
	if e.kcm != nil && e.kcm.Process != nil {
		Terminate(e.kcm.Process, os.Interrupt, e.kcmDone, 10*time.Second)
	}
	if err := e.env.Stop(); err != nil {
		errs = append(errs, fmt.Errorf("stop control plane: %w", err))
	}
	if err := os.RemoveAll(e.workDir); err != nil {
		errs = append(errs, fmt.Errorf("remove work dir: %w", err))
	}
	return errors.Join(errs...)
}

// StopAPIServer stops kube-apiserver (Restartable only); etcd keeps
// running. An API server that has not exited 10 s after SIGTERM is killed
// (SIGKILL), as a crash would; StopAPIServer returns once its port refuses
// connections.
func (e *Env) StopAPIServer() error {
	as := e.env.ControlPlane.APIServer
	err := as.Stop()
	if err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	addr := net.JoinHostPort(as.SecureServing.Address, as.SecureServing.Port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, derr := net.DialTimeout("tcp", addr, time.Second)
		if derr != nil {
			return nil
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver still listens on %s 30s after it was stopped (%v)", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StartAPIServer starts kube-apiserver again on the same address with the
// same certificates, and waits until it is healthy (Restartable only).
func (e *Env) StartAPIServer() error {
	if err := e.env.ControlPlane.APIServer.Start(); err != nil {
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	return nil
}

// StopEtcd stops etcd, keeping its data (Restartable only).
func (e *Env) StopEtcd() error {
	if err := e.env.ControlPlane.Etcd.Stop(); err != nil {
		return fmt.Errorf("stop etcd: %w", err)
	}
	return nil
}

// StartEtcd starts etcd again on the same address with the same data
// (Restartable only).
func (e *Env) StartEtcd() error {
	if err := e.env.ControlPlane.Etcd.Start(); err != nil {
		return fmt.Errorf("restart etcd: %w", err)
	}
	return nil
}

// Kubectl runs kubectl against the control plane and returns its standard
// output; a failure carries its standard error. It uses the kubectl that
// `make testenv` built next to the API server when there is one, else the one
// on PATH (/usr/bin/kubectl on this machine kind).
func (e *Env) Kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	bin := filepath.Join(e.env.BinaryAssetsDirectory, "kubectl")
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("kubectl"); err != nil {
			return "", fmt.Errorf("find kubectl (none on PATH; `make testenv` builds one when missing): %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", e.KubeconfigPath}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func (e *Env) startControllerManager(assets string, out *os.File) error {
	bin := filepath.Join(assets, "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("find kube-controller-manager (run `make testenv` to build it): %w", err)
	}
	cmd := exec.Command(bin,
		"--kubeconfig="+e.KubeconfigPath,
		"--authentication-kubeconfig="+e.KubeconfigPath,
		"--authorization-kubeconfig="+e.KubeconfigPath,
		"--controllers=garbagecollector,namespace,serviceaccount",
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--concurrent-gc-syncs=5",
	)
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kube-controller-manager: %w", err)
	}
	e.kcm = cmd
	e.kcmDone = make(chan error, 1)
	go func() { e.kcmDone <- cmd.Wait() }()
	return nil
}

// allCRDs returns Embark's CRDs and Istio's.
func allCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	own, err := crds.All()
	if err != nil {
		return nil, err
	}
	istio, err := IstioCRDs()
	if err != nil {
		return nil, err
	}
	return append(own, istio...), nil
}

// AssetsDir returns the directory holding the binaries `make testenv`
// builds: dir when set, else $KUBEBUILDER_ASSETS, else bin/testenv in the
// repository root.
func AssetsDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin", "testenv")
	}
	return dir, nil
}

// assetsDir finds the directory holding the control-plane binaries and
// checks they are there.
func assetsDir(dir string) (string, error) {
	dir, err := AssetsDir(dir)
	if err != nil {
		return "", err
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("control-plane binary %s missing in %s: run `make testenv`: %w", name, dir, err)
		}
	}
	return dir, nil
}

// RepoRoot returns the root of the Embark module, found by walking up from the
// working directory to the go.mod that declares it.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("get working directory: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(data), []byte("module github.com/embark-mesh/embark\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the github.com/embark-mesh/embark module")
		}
		dir = parent
	}
}
