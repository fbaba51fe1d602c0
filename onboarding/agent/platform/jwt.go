package platform

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// maxJWT bounds what a token file or plugin may produce.
const maxJWT = 64 << 10

// JWT is the on-prem platform: a JWT from a file or a credential plugin.
type JWT struct {
	file    string
	command []string
	timeout time.Duration
}

// NewJWT returns the on-prem platform.
func NewJWT(cfg config.JWTPlatform) (*JWT, error) {
	if cfg.TokenFile == "" && len(cfg.Command) == 0 {
		return nil, errors.New("jwt: host.jwt names no tokenFile or command")
	}
	timeout := config.DefaultCredentialTimeout
	if cfg.Timeout != nil && cfg.Timeout.Duration > 0 {
		timeout = cfg.Timeout.Duration
	}
	return &JWT{file: cfg.TokenFile, command: cfg.Command, timeout: timeout}, nil
}

// Name implements Platform.
func (*JWT) Name() string { return config.PlatformJWT }

func (j *JWT) source() string {
	if j.file != "" {
		return "file " + j.file
	}
	return "command " + strings.Join(j.command, " ")
}

// Credential implements Platform: it rereads the file or reruns the plugin.
func (j *JWT) Credential(ctx context.Context) (*Credential, error) {
	var raw []byte
	if j.file != "" {
		b, err := os.ReadFile(j.file)
		if err != nil {
			return nil, fmt.Errorf("jwt: read token file: %w", err)
		}
		raw = b
	} else {
		cctx, cancel := context.WithTimeout(ctx, j.timeout)
		defer cancel()
		cmd := exec.CommandContext(cctx, j.command[0], j.command[1:]...)
		var stderr bytes.Buffer
		cmd.Stderr = &limited{buf: &stderr, n: 4096}
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("jwt: credential plugin %s: %w (stderr: %s)", j.command[0], err, strings.TrimSpace(stderr.String()))
		}
		raw = out
	}
	if len(raw) > maxJWT {
		return nil, fmt.Errorf("jwt: %s produced more than %d bytes", j.source(), maxJWT)
	}
	tok := strings.TrimSpace(string(raw))
	if tok == "" {
		return nil, fmt.Errorf("jwt: %s produced no token", j.source())
	}
	if strings.Count(tok, ".") != 2 || strings.ContainsAny(tok, " \n\t") {
		return nil, fmt.Errorf("jwt: %s produced something that is not a compact JWT", j.source())
	}
	return &Credential{JWT: &onboardingv1alpha1.JWTCredential{Token: tok}}, nil
}

// limited keeps the first n bytes written.
type limited struct {
	buf *bytes.Buffer
	n   int
}

func (l *limited) Write(p []byte) (int, error) {
	if room := l.n - l.buf.Len(); room > 0 {
		if len(p) > room {
			l.buf.Write(p[:room])
		} else {
			l.buf.Write(p)
		}
	}
	return len(p), nil
}
