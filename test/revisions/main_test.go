package revisions

import (
	"context"
	"testing"

	"github.com/embark-mesh/embark/test/testenv"
)

var (
	env *testenv.Env
	// def is the default revision's istiod (testenv's REVISION=default, as
	// Istio's chart sets it), canary the canary revision's.
	def, canary *testenv.Istiod
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &env, func(ctx context.Context) error {
		var err error
		if def, err = testenv.StartIstiod(ctx, env, testenv.IstiodOptions{}); err != nil {
			return err
		}
		context.AfterFunc(ctx, func() { _ = def.Close() })
		// Started second, the canary finds the default's CA Secret
		// (istio-ca-secret) and signs with the same root.
		if canary, err = testenv.StartIstiod(ctx, env, testenv.IstiodOptions{Env: []string{"REVISION=canary"}}); err != nil {
			return err
		}
		context.AfterFunc(ctx, func() { _ = canary.Close() })
		return nil
	})
}
