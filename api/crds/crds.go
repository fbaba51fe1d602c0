// Package crds embeds the CustomResourceDefinitions of Embark's own APIs, as
// `make generate` writes them, so that binaries and tests install exactly what
// is committed.
package crds

import (
	"embed"
	"fmt"
	"io/fs"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

//go:embed *.onboarding.tetrate.io_*.yaml
var files embed.FS

// FS holds one YAML file per CRD.
func FS() fs.FS { return files }

// All decodes every embedded CRD, in file-name order.
func All() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	names, err := fs.Glob(files, "*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list embedded CRDs: %w", err)
	}
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(names))
	for _, name := range names {
		data, err := files.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read embedded CRD %s: %w", name, err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return nil, fmt.Errorf("decode embedded CRD %s: %w", name, err)
		}
		out = append(out, crd)
	}
	return out, nil
}
