package install

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/test/testenv"
)

// The README's `helm install` block is read as a shell reads it: joined
// continuation lines, quotes, its release, chart, namespace and --set
// values; a flag the test does not understand, or shell it cannot know
// the value of, is an error naming it.
func TestReadmeHelmInstall(t *testing.T) {
	tests := []struct {
		name    string
		md      string
		want    helmInstall
		wantErr string
	}{
		{name: "README's shape",
			md: "text\n```sh\nkubectl -n istio-system create secret generic key --from-file=signing.asc\nhelm install embark manifests/charts/embark -n istio-system \\\n  --set hosts[0]=a.example.corp \\\n  --set tls.secretName=tls\nkubectl get svc\n```\n",
			want: helmInstall{Release: "embark", Chart: "manifests/charts/embark", Namespace: "istio-system", Sets: []string{"hosts[0]=a.example.corp", "tls.secretName=tls"},
				Before: [][]string{{"kubectl", "-n", "istio-system", "create", "secret", "generic", "key", "--from-file=signing.asc"}}}},
		{name: "quotes, = forms, comments",
			md:   "```sh\n# install\nhelm install r ./c --namespace=ns --set 'a=b c' --set=\"d={x,y}\" # done\n```\n",
			want: helmInstall{Release: "r", Chart: "./c", Namespace: "ns", Sets: []string{"a=b c", "d={x,y}"}}},
		{name: "no namespace: default", md: "```sh\nhelm install r c\n```\n", want: helmInstall{Release: "r", Chart: "c", Namespace: "default"}},
		{name: "a flag not understood", md: "```sh\nhelm install r c -f values.yaml\n```\n", wantErr: "flag -f is not understood"},
		{name: "a variable", md: "```sh\nhelm install r c --set hosts[0]=$HOST\n```\n", wantErr: `shell syntax "$"`},
		{name: "no chart", md: "```sh\nhelm install r\n```\n", wantErr: "want a release name and a chart"},
		{name: "no command", md: "```sh\nkubectl get pods\n```\n```yaml\nhelm install r c\n```\n", wantErr: "no ```sh block with a `helm install` command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "README.md")
			if err := os.WriteFile(path, []byte(tc.md), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := readmeHelmInstall(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The repository's README has a command the test understands, installing
// the chart with a host and a TLS Secret.
func TestRepositoryReadmeHelmInstall(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	h, err := readmeHelmInstall(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if h.Chart != "manifests/charts/embark" || len(h.Sets) == 0 {
		t.Errorf("README installs %+v, want the chart manifests/charts/embark with --set values", h)
	}
}

// The operator guide's objects are the whole YAML objects of the chosen
// sections; fragments and other sections are left out.
func TestGuideObjects(t *testing.T) {
	md := "## 1. Other\n```yaml\napiVersion: v1\nkind: ConfigMap\n```\n" +
		"## 3. Group\n```yaml\napiVersion: networking.istio.io/v1\nkind: WorkloadGroup\n```\n" +
		"### sub\n```yaml\nspec:\n  allow: []\n```\n```yaml\napiVersion: v1\nkind: Secret\n```\n"
	path := filepath.Join(t.TempDir(), "guide.md")
	if err := os.WriteFile(path, []byte(md), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := guideObjects(path, "3.")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\n", "apiVersion: v1\nkind: Secret\n"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("objects %q, want %q", got, want)
	}
	if _, err := guideObjects(path, "9."); err == nil || !strings.Contains(err.Error(), `no objects below headings ["9."]`) {
		t.Errorf("error %v for a section with no objects", err)
	}
}

// Any markdown gives a command or an error, never a panic; a command has
// a release and a chart, and no word of its --set values is lost.
func FuzzParseReadmeHelmInstall(f *testing.F) {
	f.Add("```sh\nhelm install embark manifests/charts/embark -n istio-system \\\n  --set hosts[0]=a.example.corp\n```\n")
	f.Add("```sh\nkubectl create secret generic k --from-file=signing.asc\nhelm install r c --set 'a=b c' --set=\"d\\\"e\" # x\n```\n")
	f.Add("```sh\nhelm install r c --set\n```\n")
	f.Fuzz(func(t *testing.T, md string) {
		h, err := parseReadmeHelmInstall(md)
		if err != nil {
			return
		}
		if h.Release == "" || h.Chart == "" {
			t.Errorf("command %+v without a release and a chart", h)
		}
		if h.Namespace == "" {
			t.Errorf("command %+v without a namespace", h)
		}
	})
}
