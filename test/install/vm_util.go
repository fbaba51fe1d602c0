//go:build install

package install

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"testing"
)

// listenHost listens on the network's host address (the host namespace).
func (n *Network) listenHost(port string) (net.Listener, error) {
	return net.Listen("tcp", net.JoinHostPort(n.HostIP.String(), port))
}

// freeLoopback returns a free 127.0.0.1 address.
func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().String()
}

// writeTLS writes a certificate chain and its key as PEM files.
func writeTLS(c tls.Certificate, certFile, keyFile string) error {
	var chain []byte
	for _, der := range c.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certFile, chain, 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
