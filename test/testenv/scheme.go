package testenv

import (
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/embark-mesh/embark/api/scheme"
)

// Scheme returns the scheme Embark's binaries use (package api/scheme).
func Scheme() (*runtime.Scheme, error) { return scheme.New() }
