package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/fixtures"
)

// rollingUpdate opts the ratings WorkloadGroup in to rolling updates
// (maxUnavailable 1), changes the group, and checks that every VM onboarded
// again with the new spec, one at a time, connected at the end.
func (d *demo) rollingUpdate(ctx context.Context, out io.Writer) error {
	file := filepath.Join(d.work, "rollout.yaml")
	if err := os.WriteFile(file, []byte(`apiVersion: runtime.onboarding.tetrate.io/v1alpha1
kind: WorkloadGroupRollout
metadata:
  name: ratings
  namespace: bookinfo
spec:
  workloadGroup: ratings
  maxUnavailable: 1
  progressDeadlineSeconds: 120
`), 0o600); err != nil {
		return err
	}
	if err := d.kubectl(ctx, out, "apply", "-f", file); err != nil {
		return err
	}
	if err := d.kubectl(ctx, out, "patch", "workloadgroup", "ratings", "-n", "bookinfo", "--type=merge", "-p", `{"spec":{"template":{"labels":{"release":"2"}}}}`); err != nil {
		return err
	}
	var ro runtimev1alpha1.WorkloadGroupRollout
	if err := fixtures.Poll(ctx, pollInterval, 4*waitFor, func() error {
		if err := d.env.Client.Get(ctx, client.ObjectKey{Namespace: "bookinfo", Name: "ratings"}, &ro); err != nil {
			return err
		}
		c := meta.FindStatusCondition(ro.Status.Conditions, runtimev1alpha1.RolloutConditionProgressing)
		if c == nil || c.Reason != runtimev1alpha1.ReasonRolloutComplete || ro.Status.WorkloadGroupGeneration < 3 || ro.Status.Updated != ro.Status.Total || ro.Status.Batches < int32(len(d.vms)) {
			return fmt.Errorf("rollout not complete: %+v", ro.Status)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := d.kubectl(ctx, out, "get", "wgr", "-n", "bookinfo"); err != nil {
		return err
	}
	want := map[string]string{}
	for _, v := range d.vms {
		want["bookinfo/"+v.Reg()] = "True"
	}
	return d.showChecked(ctx, out, func(s string) error { return check.WARs(s, want) }, "get", "war", "-A")
}
