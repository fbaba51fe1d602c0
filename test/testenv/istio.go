package testenv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// istioCRDFile is where the istio.io/api module ships the CRDs of Istio's
// configuration APIs.
const istioCRDFile = "kubernetes/customresourcedefinitions.gen.yaml"

// IstioCRDs returns the CRDs that ship inside the istio.io/api module required
// by go.mod (WorkloadGroup, WorkloadEntry, Sidecar, ServiceEntry and the rest of
// Istio's configuration APIs), so tests run against Istio's real schemas.
func IstioCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	dir, err := istioAPIModuleDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, istioCRDFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read Istio CRDs: %w", err)
	}
	return decodeCRDs(data, path)
}

// decodeCRDs decodes a multi-document YAML stream of CRDs; name is used in
// errors.
func decodeCRDs(data []byte, name string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*apiextensionsv1.CustomResourceDefinition
	for i := 0; ; i++ {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		err := dec.Decode(crd)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("decode document %d of %s: %w", i, name, err)
		}
		if crd.Kind == "" && crd.Name == "" {
			continue // an empty document
		}
		if crd.Kind != "CustomResourceDefinition" {
			return nil, fmt.Errorf("document %d of %s is a %q, not a CustomResourceDefinition", i, name, crd.Kind)
		}
		out = append(out, crd)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no CustomResourceDefinition", name)
	}
	return out, nil
}

// istioAPIModuleDir asks the go command where the istio.io/api module that
// go.mod requires lives (downloading it when needed).
func istioAPIModuleDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-mod=readonly", "-m", "-json", "istio.io/api")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locate the istio.io/api module: %w: %s", err, stderr.String())
	}
	var mod struct {
		Dir     string
		Version string
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		return "", fmt.Errorf("decode `go list -m -json istio.io/api`: %w", err)
	}
	if mod.Dir == "" {
		// Listed but not yet extracted into the module cache.
		dl := exec.Command("go", "mod", "download", "-json", "istio.io/api")
		dl.Dir = root
		out, err := dl.Output()
		if err != nil {
			return "", fmt.Errorf("download the istio.io/api module: %w", err)
		}
		if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
			return "", fmt.Errorf("download the istio.io/api module: no directory reported (%v)", err)
		}
	}
	return mod.Dir, nil
}
