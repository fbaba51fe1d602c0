package adversarial

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
)

// repositoryPlane is the real endpoint (app.Run) serving its local
// repository over HTTPS on loopback with the limits.repository of the test.
type repositoryPlane struct {
	addr string
	tls  *tls.Config // trusts the serving certificate
	file string      // URL path of a package larger than any socket buffer
	size int64
}

// packageSize is larger than what the kernels buffer on a loopback
// connection whose receive buffer the client fixes (the sender's tcp_wmem
// maximum, 4 MiB by default, and the receiver's buffer), so a client that
// never reads leaves the server blocked in Write.
const packageSize = 16 << 20

// startRepository runs the endpoint with localRepository and repoLimits
// (its limits.repository) and returns where its repository serves.
func startRepository(t *testing.T, repoLimits limits.Options) *repositoryPlane {
	t.Helper()
	ns := env.Namespace(t)
	dir := t.TempDir()
	repo := filepath.Join(dir, "repository")
	if err := os.MkdirAll(filepath.Join(repo, "deb", "amd64"), 0o755); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(repo, "deb", "amd64", "onboarding-agent.deb")
	f, err := os.Create(pkg)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(packageSize); err != nil { // sparse: no disk written
		t.Fatal(err)
	}
	_ = f.Close()

	const host = configkit.Host
	ca, err := fixtures.NewCA("repository test CA")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := ca.ServingCert(dir, host)
	if err != nil {
		t.Fatal(err)
	}
	pool := ca.Pool()
	cfg := configkit.Serving(configkit.Config(ns), certFile, keyFile)
	cfg.Istiod = config.Istiod{Address: fixtures.FreeAddr(t), ServerName: "istiod.istio-system.svc",
		RootCertFile: fixtures.RootFile(t, dir, "istiod-root.pem", "absent istiod")}
	cfg.LocalRepository = &config.LocalRepository{Directory: repo}
	cfg.Limits.Repository = repoLimits
	e := endpointkit.Start(t, endpointkit.Options{Config: cfg, Kubeconfig: env.KubeconfigPath, Replica: "repo-" + ns, Dir: dir})
	repoAddr := e.Config.Listen.Repository
	return &repositoryPlane{
		addr: repoAddr, tls: &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12},
		file: "/install/deb/amd64/onboarding-agent.deb", size: packageSize,
	}
}

// dialTLS opens a TLS connection to the repository from src (a loopback
// address) and completes the handshake.
func (p *repositoryPlane) dialTLS(t *testing.T, src string) (*tls.Conn, error) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	raw, err := d.DialContext(t.Context(), "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, p.tls)
	t.Cleanup(func() { _ = c.Close() })
	if err := c.HandshakeContext(t.Context()); err != nil {
		return nil, err
	}
	return c, nil
}

// get sends a GET of path on c and returns the response (body unread).
func (p *repositoryPlane) get(c net.Conn, path string) (*http.Response, error) {
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: repository\r\n\r\n", path); err != nil {
		return nil, err
	}
	return http.ReadResponse(bufio.NewReader(c), nil)
}

// closedByServer reports whether the server has closed c: a read within
// wait returns EOF or a reset. A timeout means c is still open.
func closedByServer(c net.Conn, wait time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func TestRepositorySlowlorisHeaders(t *testing.T) {
	Attack(t, "repository: a slowloris client trickles request headers to hold a connection forever")
	p := startRepository(t, limits.Options{HTTPReadHeaderTimeout: configkit.Duration(time.Second)})
	c, err := p.dialTLS(t, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	// One header byte every 100ms, never the blank line that ends them: a
	// server without a read-header timeout waits for as long as this goes
	// on. 600 bytes are a minute; the server must hang up long before.
	line := "GET " + p.file + " HTTP/1.1\r\nHost: repository\r\nX-Slow: " + strings.Repeat("a", 600)
	for i := range len(line) {
		if _, err := c.Write([]byte{line[i]}); err != nil {
			return // the server closed the connection: refused
		}
		if closedByServer(c, 100*time.Millisecond) {
			return
		}
	}
	t.Fatalf("the server still held the connection after %d header bytes sent over a minute", len(line))
}

func TestRepositoryReaderThatNeverReads(t *testing.T) {
	Attack(t, "repository: a client requests a package and never reads the answer, holding the server's writer")
	p := startRepository(t, limits.Options{HTTPWriteTimeout: configkit.Duration(2 * time.Second)})
	raw, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	// A fixed receive buffer (no autotuning up to tcp_rmem's maximum, 32 MiB
	// on some hosts): what the kernels buffer stays far below the package,
	// so the server's Write blocks; large enough that draining it after the
	// attack is quick.
	if err := raw.(*net.TCPConn).SetReadBuffer(256 << 10); err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, p.tls)
	t.Cleanup(func() { _ = c.Close() })
	resp, err := p.get(c, p.file)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.ContentLength != p.size {
		t.Fatalf("GET %s: %s, %d bytes, want 200 and %d", p.file, resp.Status, resp.ContentLength, p.size)
	}
	// Read nothing for twice the write timeout: the server, blocked writing
	// into a full window, must give up and close the connection. (The sleep
	// is the attack itself, not a timing assertion: nothing the client does
	// can tell it earlier whether the server gave up.) Draining what the
	// kernel buffered then ends before the whole package.
	time.Sleep(4 * time.Second)
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil || n >= p.size {
		t.Fatalf("read %d of %d bytes (error %v) after not reading past the write timeout: the server kept the response open", n, p.size, err)
	}
	// The server is not stuck: a fresh connection is answered.
	ok, err := p.dialTLS(t, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := p.get(ok, p.file+".sha256"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a fresh connection after the attack: %v %v", resp, err)
	}
}

func TestRepositoryMoreConnectionsThanTheCap(t *testing.T) {
	Attack(t, "repository: more connections than the per-source and total caps, held open")
	p := startRepository(t, limits.Options{MaxConnectionsPerSource: 2, MaxConnections: 4})
	var held []*tls.Conn
	for _, src := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"} {
		c, err := p.dialTLS(t, src)
		if err != nil {
			t.Fatalf("connection from %s within the caps: %v", src, err)
		}
		held = append(held, c)
	}
	// Over the per-source cap (a third from 127.0.0.2) and over the total
	// cap (127.0.0.4 has none yet): closed at once, no TLS handshake.
	for _, src := range []string{"127.0.0.2", "127.0.0.4"} {
		if c, err := p.dialTLS(t, src); err == nil {
			if !closedByServer(c, 10*time.Second) {
				t.Errorf("a connection from %s over the caps was accepted and held", src)
			}
		}
	}
	// The connections within the caps still work, and closing one frees a
	// place for another source.
	resp, err := p.get(held[0], "/install/deb/amd64/onboarding-agent.deb.sha256")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a held connection within the caps: %v %v", resp, err)
	}
	_ = held[2].Close()
	waitUntil(t, "a place freed by a closed connection is given to another source", func() bool {
		c, err := p.dialTLS(t, "127.0.0.4")
		if err != nil {
			return false
		}
		resp, err := p.get(c, "/install/deb/amd64/onboarding-agent.deb.sha256")
		return err == nil && resp.StatusCode == http.StatusOK
	})
}
