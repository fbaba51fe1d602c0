package burst

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// apiWrites reads the API server's own count of the write requests it
// served (apiserver_request_total, every verb but GET, LIST and WATCH),
// keyed "verb resource[/subresource]": the burst's writes are the
// difference of two readings, whoever made them (Embark, istiod, the
// garbage collector).
func apiWrites(ctx context.Context, cs kubernetes.Interface) (map[string]float64, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parse the API server's metrics: %w", err)
	}
	out := map[string]float64{}
	fam, ok := families["apiserver_request_total"]
	if !ok {
		return nil, fmt.Errorf("the API server's metrics have no apiserver_request_total")
	}
	for _, m := range fam.GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		switch l["verb"] {
		case "GET", "LIST", "WATCH", "CONNECT":
			continue
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out, nil
}

// namespacesGone waits until no namespace is being deleted.
func namespacesGone(ctx context.Context) error {
	terminating := 0
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list := &corev1.NamespaceList{}
		if err := cluster.Env.Client.List(ctx, list); err != nil {
			return false, fmt.Errorf("list namespaces: %w", err)
		}
		terminating = 0
		for _, ns := range list.Items {
			if ns.Status.Phase == corev1.NamespaceTerminating {
				terminating++
			}
		}
		return terminating == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%d namespaces still being deleted: %w", terminating, err)
	}
	return nil
}

// writesPerVM formats after − before per VM, largest first (those of at
// least 0.01 per VM).
func writesPerVM(before, after map[string]float64, vms int) (total float64, detail string) {
	diff := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			total += d
			if d/float64(vms) >= 0.01 {
				diff[k] = d
			}
		}
	}
	keys := slices.SortedFunc(maps.Keys(diff), func(a, b string) int {
		return cmp.Or(cmp.Compare(diff[b], diff[a]), strings.Compare(a, b))
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.2f", k, diff[k]/float64(vms))
	}
	return total / float64(vms), strings.Join(parts, ", ")
}
