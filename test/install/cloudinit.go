package install

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// CloudConfig is the subset of cloud-init's #cloud-config that the examples
// in docs/examples/cloud-init use, and that the install test interprets:
//   - write_files: path, content, permissions (octal string, default
//     "0644"), owner ("user:group", default root:root), encoding (text/plain
//     or b64), append (default false); written before runcmd, as cloud-init
//     does (its write_files module runs in the init stage, runcmd in the
//     final stage). defer is not supported.
//   - runcmd: each entry a string (a line of the shell script, as is) or a
//     list (argv, each word quoted); run as one /bin/sh script. Unlike
//     cloud-init's runcmd script, it stops at the first failing command
//     (set -e), so a broken step fails the test rather than the next one.
//
// Any other key is refused, so an example that starts to need more fails
// its test instead of being half run.
type CloudConfig struct {
	WriteFiles []WriteFile `json:"write_files,omitempty"`
	RunCmd     []RunCmd    `json:"runcmd,omitempty"`
}

// WriteFile is one entry of write_files.
type WriteFile struct {
	Path        string `json:"path"`
	Content     string `json:"content,omitempty"`
	Encoding    string `json:"encoding,omitempty"`
	Permissions string `json:"permissions,omitempty"`
	Owner       string `json:"owner,omitempty"`
	Append      bool   `json:"append,omitempty"`
}

// RunCmd is one entry of runcmd: Line (a string entry) or Argv.
type RunCmd struct {
	Line string
	Argv []string
}

// UnmarshalJSON accepts a string or a list of strings.
func (r *RunCmd) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, &r.Line); err == nil {
		return nil
	}
	if err := json.Unmarshal(b, &r.Argv); err != nil || len(r.Argv) == 0 {
		return fmt.Errorf("runcmd entry %s: want a string or a non-empty list of strings", b)
	}
	return nil
}

var (
	octalMode = regexp.MustCompile(`^0?[0-7]{3,4}$`)
	ownerRe   = regexp.MustCompile(`^[a-z_][a-z0-9_-]*(:[a-z_][a-z0-9_-]*)?$`)
)

// ParseCloudConfig parses user-data that must start with the #cloud-config
// line, strictly (unknown keys are errors naming them), and checks each
// entry.
func ParseCloudConfig(data []byte) (*CloudConfig, error) {
	first, _, _ := bytes.Cut(data, []byte("\n"))
	if strings.TrimSpace(string(first)) != "#cloud-config" {
		return nil, fmt.Errorf("user-data: first line %q, want #cloud-config", first)
	}
	c := &CloudConfig{}
	if err := yaml.UnmarshalStrict(data, c); err != nil {
		return nil, fmt.Errorf("user-data: %w", err)
	}
	for i, f := range c.WriteFiles {
		if err := f.check(); err != nil {
			return nil, fmt.Errorf("user-data: write_files[%d]: %w", i, err)
		}
	}
	return c, nil
}

func (f WriteFile) check() error {
	switch {
	case !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path:
		return fmt.Errorf("path %q: want a clean absolute path", f.Path)
	case f.Permissions != "" && !octalMode.MatchString(f.Permissions):
		return fmt.Errorf("permissions %q: want an octal mode such as '0644'", f.Permissions)
	case f.Owner != "" && !ownerRe.MatchString(f.Owner):
		return fmt.Errorf("owner %q: want user or user:group", f.Owner)
	case f.Encoding != "" && f.Encoding != "text/plain" && f.Encoding != "b64" && f.Encoding != "base64":
		return fmt.Errorf("encoding %q: want text/plain or b64", f.Encoding)
	}
	if f.Encoding == "b64" || f.Encoding == "base64" {
		if _, err := base64.StdEncoding.DecodeString(f.Content); err != nil {
			return fmt.Errorf("content: %w", err)
		}
	}
	return nil
}

// Fill replaces placeholder strings in every file's content and path and
// in every runcmd entry, as an operator edits the example before using it;
// each placeholder must occur somewhere.
func (c *CloudConfig) Fill(values map[string]string) error {
	for placeholder, v := range values {
		found := false
		replace := func(s *string) {
			if strings.Contains(*s, placeholder) {
				found = true
				*s = strings.ReplaceAll(*s, placeholder, v)
			}
		}
		for i := range c.WriteFiles {
			replace(&c.WriteFiles[i].Content)
		}
		for i := range c.RunCmd {
			replace(&c.RunCmd[i].Line)
			for j := range c.RunCmd[i].Argv {
				replace(&c.RunCmd[i].Argv[j])
			}
		}
		if !found {
			return fmt.Errorf("user-data: no %q to fill in", placeholder)
		}
	}
	return nil
}

// Script returns one /bin/sh script doing what cloud-init does with c:
// write_files (content as base64, decoded by base64 -d; mode; owner), then
// the runcmd entries in order, stopping at the first failing command.
func (c *CloudConfig) Script() string {
	var b strings.Builder
	b.WriteString("set -e\n# write_files\n")
	for _, f := range c.WriteFiles {
		content := f.Content
		if f.Encoding != "b64" && f.Encoding != "base64" {
			content = base64.StdEncoding.EncodeToString([]byte(f.Content))
		}
		perm, redirect := f.Permissions, ">"
		if perm == "" {
			perm = "0644"
		}
		if f.Append {
			redirect = ">>"
		}
		fmt.Fprintf(&b, "mkdir -p %s\necho %s | base64 -d %s %s\nchmod %s %s\n",
			shellQuote(path.Dir(f.Path)), content, redirect, shellQuote(f.Path), perm, shellQuote(f.Path))
		if f.Owner != "" { // cloud-init runs as root: files are root's otherwise
			fmt.Fprintf(&b, "chown %s %s\n", f.Owner, shellQuote(f.Path))
		}
	}
	b.WriteString("# runcmd\n")
	for _, r := range c.RunCmd {
		if r.Argv == nil {
			b.WriteString(r.Line + "\n")
			continue
		}
		words := make([]string, len(r.Argv))
		for i, w := range r.Argv {
			words[i] = shellQuote(w)
		}
		b.WriteString(strings.Join(words, " ") + "\n")
	}
	return b.String()
}

// shellQuote quotes s for sh as cloud-init does for argv entries.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// cloudInitExamples are the files of docs/examples/cloud-init with the
// placeholders an operator replaces in each.
var cloudInitExamples = map[string][]string{
	"ec2-autoscaling.yaml": {cloudInitHost, cloudInitKeys, cloudInitCA},
	"onprem.yaml":          {cloudInitHost, cloudInitKeys, cloudInitCA, cloudInitJWTCommand},
}

const (
	cloudInitHost       = "onboarding-endpoint.example.com"
	cloudInitKeys       = "<fingerprint>"
	cloudInitCA         = "<the PEM of the CA that signed the endpoint's certificate>"
	cloudInitJWTCommand = "/usr/local/bin/get-onboarding-jwt"
)
