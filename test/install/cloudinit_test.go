package install

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseCloudConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    string
		wantErr string
	}{
		{name: "files and commands", data: "#cloud-config\nwrite_files:\n- path: /etc/x\n  content: hi\n  permissions: '0600'\n  owner: root:root\nruncmd:\n- echo hi\n- [echo, two words]\n"},
		{name: "no header", data: "write_files: []\n", wantErr: "want #cloud-config"},
		{name: "unknown key", data: "#cloud-config\npackages: [curl]\n", wantErr: `unknown field "packages"`},
		{name: "unknown file key", data: "#cloud-config\nwrite_files:\n- path: /x\n  defer: true\n", wantErr: `unknown field "defer"`},
		{name: "relative path", data: "#cloud-config\nwrite_files:\n- path: etc/x\n", wantErr: "write_files[0]: path \"etc/x\""},
		{name: "unclean path", data: "#cloud-config\nwrite_files:\n- path: /etc/../x\n", wantErr: "want a clean absolute path"},
		{name: "bad mode", data: "#cloud-config\nwrite_files:\n- path: /x\n  permissions: '0999'\n", wantErr: "permissions \"0999\""},
		{name: "bad owner", data: "#cloud-config\nwrite_files:\n- path: /x\n  owner: 'root; rm'\n", wantErr: "owner"},
		{name: "bad base64", data: "#cloud-config\nwrite_files:\n- path: /x\n  encoding: b64\n  content: '%%%'\n", wantErr: "content"},
		{name: "bad runcmd entry", data: "#cloud-config\nruncmd:\n- {a: b}\n", wantErr: "want a string or a non-empty list"},
		{name: "empty argv", data: "#cloud-config\nruncmd:\n- []\n", wantErr: "want a string or a non-empty list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCloudConfig([]byte(tc.data))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestCloudConfigScript runs the script of a config with sh: files written
// with their content and mode before the commands, argv entries quoted,
// placeholders filled in, a failing command stops it.
func TestCloudConfigScript(t *testing.T) {
	dir := t.TempDir()
	data := "#cloud-config\nwrite_files:\n- path: " + dir + "/a/file\n  content: |\n    KEY=<value>\n  permissions: '0640'\n" +
		"- path: " + dir + "/b64\n  encoding: b64\n  content: aGVsbG8=\n" +
		"- path: " + dir + "/b64\n  content: \" again\"\n  append: true\n" +
		"runcmd:\n- cat " + dir + "/a/file > " + dir + "/out\n- [sh, -c, 'echo \"$0\" >> " + dir + "/out', \"it's <value>\"]\n- 'false'\n- touch " + dir + "/never\n"
	c, err := ParseCloudConfig([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Fill(map[string]string{"<value>": "v1"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Fill(map[string]string{"<absent>": "x"}); err == nil || !strings.Contains(err.Error(), `no "<absent>"`) {
		t.Fatalf("Fill of an absent placeholder: %v", err)
	}
	out, err := exec.CommandContext(t.Context(), "sh", "-c", c.Script()).CombinedOutput()
	if err == nil {
		t.Fatalf("the script ran past 'false':\n%s", out)
	}
	if got := readTestFile(t, filepath.Join(dir, "out")); got != "KEY=v1\nit's v1\n" {
		t.Errorf("out = %q", got)
	}
	if got := readTestFile(t, filepath.Join(dir, "b64")); got != "hello again" {
		t.Errorf("b64 = %q", got)
	}
	if fi, err := os.Stat(filepath.Join(dir, "a/file")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("a/file: %v %v, want mode 0640", fi.Mode(), err)
	}
	if _, err := os.Stat(filepath.Join(dir, "never")); err == nil {
		t.Error("a command after the failing one ran")
	}
}

// TestCloudInitExamplesParse keeps docs/examples/cloud-init within the
// subset the install test interprets, with the placeholders it fills in.
func TestCloudInitExamplesParse(t *testing.T) {
	for name, placeholders := range cloudInitExamples {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("../../docs/examples/cloud-init", name))
			if err != nil {
				t.Fatal(err)
			}
			c, err := ParseCloudConfig(data)
			if err != nil {
				t.Fatal(err)
			}
			values := map[string]string{}
			for _, p := range placeholders {
				values[p] = "filled"
			}
			if err := c.Fill(values); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func FuzzParseCloudConfig(f *testing.F) {
	f.Add([]byte("#cloud-config\nwrite_files:\n- path: /x\n  content: y\nruncmd:\n- echo\n- [a, b]\n"))
	f.Add([]byte("#cloud-config\nruncmd: [[]]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCloudConfig(data)
		if err != nil {
			return
		}
		for _, w := range c.WriteFiles {
			if !strings.HasPrefix(w.Path, "/") {
				t.Fatalf("accepted path %q", w.Path)
			}
		}
		_ = c.Script()
	})
}

func readTestFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
