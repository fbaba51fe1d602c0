//go:build packages

package integration

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestSignedRepository: Debian's apt-get and dnf, as a VM runs them, update
// from the real endpoint's local repository over HTTPS on loopback with
// signature checks on, and get the onboarding-agent packages `make
// packages` built and signed; a package, an index or a signed file changed
// on the way (a tampering HTTPS proxy in front of the endpoint, the only
// stand-in: a man in the middle or a bad mirror), and a key other than the
// repository's, are refused by them.
//
// Run by `make packages` (go test -tags packages) with PACKAGES_DIR (its
// output, deb/<arch>/... and rpm/<arch>/...) and PACKAGE_SIGNING_KEY (the
// armored private key the packages were signed with, which the endpoint
// signs the metadata with).
func TestSignedRepository(t *testing.T) {
	pkgDir, keyFile := os.Getenv("PACKAGES_DIR"), os.Getenv("PACKAGE_SIGNING_KEY")
	if pkgDir == "" || keyFile == "" {
		t.Fatal("PACKAGES_DIR and PACKAGE_SIGNING_KEY must be set: run `make packages`")
	}
	for _, tool := range []string{"apt-get", "dpkg", "dnf", "rpm", "gpg"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (apt-get install --no-install-recommends apt dnf rpm gpg): %v", tool, err)
		}
	}
	w := newWorld(t)
	for _, f := range []string{"deb/amd64/onboarding-agent.deb", "deb/arm64/onboarding-agent.deb", "rpm/amd64/onboarding-agent.rpm", "rpm/arm64/onboarding-agent.rpm"} {
		b, err := os.ReadFile(filepath.Join(pkgDir, f))
		must(t, err)
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(w.repoDir, f)), 0o755))
		must(t, os.WriteFile(filepath.Join(w.repoDir, f), b, 0o644))
	}
	abs, err := filepath.Abs(keyFile)
	must(t, err)
	w.cfg.LocalRepository.SigningKeyFile = abs
	w.startEndpoint()
	_, port, err := net.SplitHostPort(w.repoAddr)
	must(t, err)
	endpointURL := "https://127.0.0.1:" + port

	// The public key a VM trusts, fetched from the endpoint and pinned by
	// its fingerprint (docs/local-repository.md).
	caPEM, err := os.ReadFile(w.caFile)
	must(t, err)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get(endpointURL + "/install/repository.asc")
	must(t, err)
	published, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	must(t, err)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /install/repository.asc: %s", resp.Status)
	}
	keys := t.TempDir()
	repoKey := filepath.Join(keys, "embark.asc")
	must(t, os.WriteFile(repoKey, published, 0o644))
	if got, want := fingerprints(t, repoKey), fingerprints(t, keyFile); got != want {
		t.Fatalf("/install/repository.asc has keys %s, want the signing key's %s", got, want)
	}
	otherKey := filepath.Join(keys, "other.asc")
	must(t, os.WriteFile(otherKey, otherPublicKey(t), 0o644))

	// The tampering proxy: HTTPS with the endpoint's own certificate (the
	// VM cannot tell them apart), changing what tamper selects.
	var tamper atomic.Pointer[func(path string, body []byte) []byte]
	target, err := url.Parse(endpointURL)
	must(t, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = client.Transport
	rp.ModifyResponse = func(r *http.Response) error {
		f := tamper.Load()
		if f == nil || *f == nil || r.StatusCode != http.StatusOK {
			return nil
		}
		body, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			return err
		}
		body = (*f)(r.Request.URL.Path, body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Length", fmt.Sprint(len(body)))
		r.Header.Del("ETag")
		return nil
	}
	proxy := httptest.NewUnstartedServer(rp)
	cert, err := tls.LoadX509KeyPair(filepath.Join(w.dir, "tls.crt"), filepath.Join(w.dir, "tls.key"))
	must(t, err)
	proxy.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	proxy.StartTLS()
	t.Cleanup(proxy.Close)
	proxyURL := proxy.URL

	// flipIn returns a tamper function inverting one byte of the responses
	// whose path matches.
	flipIn := func(match func(string) bool) func(string, []byte) []byte {
		return func(p string, b []byte) []byte {
			if !match(p) || len(b) == 0 {
				return b
			}
			b = bytes.Clone(b)
			b[len(b)/2] ^= 0xff
			return b
		}
	}
	setTamper := func(f func(string, []byte) []byte) { tamper.Store(&f) }
	isDeb := func(p string) bool { return strings.HasSuffix(p, ".deb") }
	isRPM := func(p string) bool { return strings.HasSuffix(p, ".rpm") }

	t.Run("apt", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			key  string
			// updateTamper changes the responses apt-get update reads,
			// downloadTamper those of apt-get download.
			updateTamper, downloadTamper func(string, []byte) []byte
			wantUpdate, wantDownload     string // "" means success; else a word of apt's error
		}{
			{name: "the repository key", key: repoKey},
			{name: "another key", key: otherKey, wantUpdate: "NO_PUBKEY"},
			{name: "tampered InRelease", key: repoKey, updateTamper: func(p string, b []byte) []byte {
				if strings.HasSuffix(p, "/InRelease") {
					return bytes.Replace(b, []byte("Label: Embark"), []byte("Label: Embarc"), 1)
				}
				return b
			}, wantUpdate: "BADSIG"},
			{name: "tampered Packages index", key: repoKey, updateTamper: flipIn(func(p string) bool { return strings.Contains(p, "/main/binary-") }), wantUpdate: "Hash Sum mismatch"},
			{name: "tampered package", key: repoKey, downloadTamper: flipIn(isDeb), wantDownload: "Hash Sum mismatch"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				setTamper(tc.updateTamper)
				base := proxyURL
				if tc.updateTamper == nil && tc.downloadTamper == nil {
					base = endpointURL // straight to the endpoint
				}
				apt := newAptRoot(t, w.caFile, tc.key, base)
				out, err := apt.run("update")
				t.Logf("apt-get update:\n%s", out)
				if !checkOutcome(t, "apt-get update", out, err, tc.wantUpdate) {
					return
				}
				setTamper(tc.downloadTamper)
				for _, arch := range []string{"amd64", "arm64"} {
					out, err = apt.run("download", "onboarding-agent:"+arch)
					t.Logf("apt-get download onboarding-agent:%s:\n%s", arch, out)
					if !checkOutcome(t, "apt-get download", out, err, tc.wantDownload) {
						if debs, _ := filepath.Glob(filepath.Join(apt.cwd, "*.deb")); len(debs) > 0 {
							t.Fatalf("apt-get download refused but left %v", debs)
						}
						continue
					}
					debs, _ := filepath.Glob(filepath.Join(apt.cwd, "onboarding-agent_*_"+arch+".deb"))
					if len(debs) != 1 {
						t.Fatalf("apt-get download wrote %v", debs)
					}
					got, err := os.ReadFile(debs[0])
					must(t, err)
					want, err := os.ReadFile(filepath.Join(pkgDir, "deb", arch, "onboarding-agent.deb"))
					must(t, err)
					if !bytes.Equal(got, want) {
						t.Fatalf("apt-get download %s: not the package built", arch)
					}
				}
				if tc.wantDownload != "" {
					return
				}
				// Unpacked into a throwaway dpkg root (the maintainer
				// scripts are install-test.sh's).
				debs, _ := filepath.Glob(filepath.Join(apt.cwd, "onboarding-agent_*_amd64.deb"))
				root := t.TempDir()
				must(t, os.MkdirAll(filepath.Join(root, "var/lib/dpkg/updates"), 0o755))
				must(t, os.MkdirAll(filepath.Join(root, "var/lib/dpkg/info"), 0o755))
				must(t, os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644))
				cmd := exec.CommandContext(t.Context(), "dpkg", "--root="+root, "--force-not-root", "--force-script-chrootless", "--unpack", debs[0])
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("dpkg --unpack: %v\n%s", err, out)
				}
				if _, err := os.Stat(filepath.Join(root, "usr/bin/onboarding-agent")); err != nil {
					t.Fatalf("dpkg --unpack: %v", err)
				}
			})
		}
	})

	t.Run("dnf", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			key    string
			tamper func(string, []byte) []byte
			want   string // "" means installed; else a phrase of dnf's error
		}{
			{name: "the repository key", key: repoKey},
			{name: "another key", key: otherKey, want: "repomd.xml GPG signature verification error: Bad GPG signature"},
			{name: "tampered repomd.xml", key: repoKey, tamper: func(p string, b []byte) []byte {
				if strings.HasSuffix(p, "/repomd.xml") {
					return bytes.Replace(b, []byte("<revision>"), []byte("<revision>1"), 1)
				}
				return b
			}, want: "repomd.xml GPG signature verification error: Bad GPG signature"},
			{name: "tampered primary metadata", key: repoKey, tamper: flipIn(func(p string) bool { return strings.HasSuffix(p, "-primary.xml.gz") }), want: "checksum doesn't match"},
			{name: "tampered package", key: repoKey, tamper: flipIn(isRPM), want: "checksum doesn't match"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				setTamper(tc.tamper)
				base := proxyURL
				if tc.tamper == nil {
					base = endpointURL // straight to the endpoint
				}
				dnf := newDnfRoot(t, w.caFile, tc.key, base)
				out, err := dnf.run("install", "onboarding-agent")
				t.Logf("dnf install onboarding-agent:\n%s", out)
				if !checkOutcome(t, "dnf install", out, err, tc.want) {
					if _, err := os.Stat(filepath.Join(dnf.root, "usr/bin/onboarding-agent")); err == nil {
						t.Fatal("dnf refused but installed the agent")
					}
					return
				}
				if _, err := os.Stat(filepath.Join(dnf.root, "usr/bin/onboarding-agent")); err != nil {
					t.Fatalf("dnf install: %v", err)
				}
				q, err := exec.CommandContext(t.Context(), "rpm", "--root", dnf.root, "-q", "--queryformat", "%{NAME} %{SIGPGP:pgpsig}", "onboarding-agent").CombinedOutput()
				if err != nil || !strings.HasPrefix(string(q), "onboarding-agent RSA/SHA256") {
					t.Fatalf("rpm -q: %v %s", err, q)
				}
			})
		}
	})
}

// checkOutcome reports whether the command succeeded as wanted (true: go
// on), failing the test when it did not fail or succeed as want says.
func checkOutcome(t *testing.T, what, out string, err error, want string) bool {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		return true
	}
	if err == nil {
		t.Fatalf("%s succeeded, want it refused (%q)\n%s", what, want, out)
	}
	if !strings.Contains(out, want) {
		t.Fatalf("%s failed without %q:\n%s", what, want, out)
	}
	return false
}

// fingerprints lists the keys of an armored key file, as gpg shows them.
func fingerprints(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "gpg", "--batch", "--show-keys", "--with-colons", file).Output()
	must(t, err)
	var fprs []string
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		// The primary key's fingerprint follows its pub/sec line.
		if (strings.HasPrefix(l, "pub:") || strings.HasPrefix(l, "sec:")) && i+1 < len(lines) && strings.HasPrefix(lines[i+1], "fpr:") {
			fprs = append(fprs, strings.Split(lines[i+1], ":")[9])
		}
	}
	if len(fprs) == 0 {
		t.Fatalf("no key in %s", file)
	}
	return strings.Join(fprs, ",")
}

// otherPublicKey is an armored public key that signed nothing here.
func otherPublicKey(t *testing.T) []byte {
	t.Helper()
	home := t.TempDir()
	gpg := func(args ...string) []byte {
		cmd := exec.CommandContext(t.Context(), "gpg", append([]string{"--batch", "--homedir", home}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("gpg %v: %v", args, err)
		}
		return out
	}
	gpg("--passphrase", "", "--quick-gen-key", "Someone else <else@example.invalid>", "rsa2048", "sign", "1d")
	out := gpg("--armor", "--export")
	t.Cleanup(func() { _ = exec.Command("gpgconf", "--homedir", home, "--kill", "all").Run() })
	return out
}

// aptRoot is a throwaway apt configuration: its own sources, lists, cache
// and (empty) dpkg status; no host key is trusted.
type aptRoot struct {
	t    *testing.T
	dir  string
	cwd  string
	opts []string
}

func newAptRoot(t *testing.T, ca, key, base string) *aptRoot {
	t.Helper()
	d := t.TempDir()
	for _, sub := range []string{"etc/apt/sources.list.d", "etc/apt/trusted.gpg.d", "etc/apt/preferences.d", "var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/lib/dpkg", "cwd"} {
		must(t, os.MkdirAll(filepath.Join(d, sub), 0o755))
	}
	must(t, os.WriteFile(filepath.Join(d, "var/lib/dpkg/status"), nil, 0o644))
	must(t, os.WriteFile(filepath.Join(d, "apt.conf"), nil, 0o644))
	// As on a VM (docs/vm-install.md): one source, signed-by the repository's key.
	src := fmt.Sprintf("deb [signed-by=%s check-valid-until=yes] %s/install/ stable main\n", key, base)
	must(t, os.WriteFile(filepath.Join(d, "etc/apt/sources.list"), []byte(src), 0o644))
	return &aptRoot{t: t, dir: d, cwd: filepath.Join(d, "cwd"), opts: []string{
		"-o", "Dir=" + d,
		"-o", "Dir::State::status=" + filepath.Join(d, "var/lib/dpkg/status"),
		"-o", "Dir::Etc::trusted=" + filepath.Join(d, "etc/apt/trusted.gpg"),
		"-o", "Dir::Etc::trustedparts=" + filepath.Join(d, "etc/apt/trusted.gpg.d"),
		"-o", "Acquire::https::CaInfo=" + ca,
		"-o", "APT::Architecture=amd64", "-o", "APT::Architectures::=amd64", "-o", "APT::Architectures::=arm64",
		"-o", "Acquire::Languages=none",
		"-o", "APT::Sandbox::User=root", // the throwaway directories are root's
		"-o", "Debug::NoLocking=1",
		"-o", "Acquire::Retries=0",
	}}
}

func (a *aptRoot) run(args ...string) (string, error) {
	cmd := exec.CommandContext(a.t.Context(), "apt-get", append(append([]string{"-q"}, a.opts...), args...)...)
	cmd.Dir = a.cwd
	cmd.Env = append(os.Environ(), "APT_CONFIG="+filepath.Join(a.dir, "apt.conf"), "LC_ALL=C") // not the host's configuration
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// dnfRoot is a throwaway dnf configuration and install root; the
// repository is the only one, with gpgcheck and repo_gpgcheck on.
type dnfRoot struct {
	t    *testing.T
	dir  string
	root string
	opts []string
}

func newDnfRoot(t *testing.T, ca, key, base string) *dnfRoot {
	t.Helper()
	d := t.TempDir()
	for _, sub := range []string{"repos.d", "log"} { // dnf splits reposdir at commas: t.TempDir has none
		must(t, os.MkdirAll(filepath.Join(d, sub), 0o755))
	}
	// As on a VM (docs/vm-install.md).
	repo := fmt.Sprintf(`[embark]
name=Embark
baseurl=%s/install/rpm/
enabled=1
gpgcheck=1
repo_gpgcheck=1
gpgkey=file://%s
sslcacert=%s
metadata_expire=0
`, base, key, ca)
	must(t, os.WriteFile(filepath.Join(d, "repos.d/embark.repo"), []byte(repo), 0o644))
	must(t, os.WriteFile(filepath.Join(d, "dnf.conf"), []byte("[main]\ngpgcheck=1\nrepo_gpgcheck=1\ninstall_weak_deps=0\n"), 0o644))
	return &dnfRoot{t: t, dir: d, root: filepath.Join(d, "root"), opts: []string{
		"-y", "--config", filepath.Join(d, "dnf.conf"), "--installroot", filepath.Join(d, "root"), "--releasever", "1",
		"--setopt", "reposdir=" + filepath.Join(d, "repos.d"),
		"--setopt", "cachedir=" + filepath.Join(d, "cache"),
		"--setopt", "logdir=" + filepath.Join(d, "log"),
		"--setopt", "persistdir=" + filepath.Join(d, "persist"),
		"--setopt", "tsflags=noscripts", // the scripts are install-test.sh's; this root has no shell
		"--disablerepo", "*", "--enablerepo", "embark",
	}}
}

func (n *dnfRoot) run(args ...string) (string, error) {
	cmd := exec.CommandContext(n.t.Context(), "dnf", append(n.opts, args...)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	return string(out), err
}
