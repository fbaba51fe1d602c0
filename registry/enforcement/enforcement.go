// Package enforcement writes each registration's ConfigurationEnforced
// condition: in standalone mode, whether Embark's translation enforces every
// policy that applies to the workload (it fails closed on what it does not),
// with a Warning Event when it does not.
package enforcement

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/internal/loop"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
)

// Options configures a ConditionWriter. Every field
// documents its default.
type Options struct {
	// Client writes registration status. Required.
	Client client.Client
	// Reader reads registrations (an informer cache). Default: Client.
	Reader client.Reader
	// Writer is the replica's write budget, shared with every component
	// that writes (write.Writer). Default: a Writer of its own with
	// write.Options' defaults.
	Writer *write.Writer
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock of condition transitions. Default time.Now.
	Now func() time.Time
}

// ConditionWriter writes the ConfigurationEnforced condition of registrations:
// False (reason UnsupportedPolicy) naming the policies that select the
// workload but are not enforced, True (reason PoliciesEnforced) once that
// list empties again. It writes only when the condition changes, and
// nothing for a registration that never had an unenforced policy. Set never
// blocks; Run writes.
type ConditionWriter struct {
	opts   Options
	writer *write.Writer
	loop   *loop.Loop

	mu   sync.Mutex
	want map[types.NamespacedName][]string
}

// New returns a ConditionWriter; run it with Run.
func New(opts Options) (*ConditionWriter, error) {
	if opts.Client == nil {
		return nil, errors.New("registry: Options.Client is required")
	}
	if opts.Reader == nil {
		opts.Reader = opts.Client
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	e := &ConditionWriter{
		opts:   opts,
		writer: write.OrDefault(opts.Writer),
		want:   map[types.NamespacedName][]string{},
	}
	e.loop = loop.New(e.write, loop.Options{Name: "write ConfigurationEnforced condition", KeyName: "registration", Logger: opts.Logger})
	return e, nil
}

// Set records what the registration's workload is served without: the
// policies (e.g. "AuthorizationPolicy bookinfo/jwt-only: ...") that select
// it but are not enforced; none means everything is. The latest call wins.
func (e *ConditionWriter) Set(key types.NamespacedName, unenforced []string) {
	e.mu.Lock()
	e.want[key] = append([]string(nil), unenforced...)
	e.mu.Unlock()
	e.loop.Add(key)
}

// Run writes the conditions Set asks for until ctx ends.
func (e *ConditionWriter) Run(ctx context.Context) {
	e.loop.Run(ctx)
}

// condition is the ConfigurationEnforced condition for a list of unenforced
// policies.
func enforcedCondition(unenforced []string, generation int64, now time.Time) metav1.Condition {
	c := metav1.Condition{
		Type: runtimev1alpha1.ConditionConfigurationEnforced, Status: metav1.ConditionTrue,
		Reason: runtimev1alpha1.ReasonPoliciesEnforced, Message: "every policy selecting the workload is enforced",
		ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(now),
	}
	if len(unenforced) > 0 {
		c.Status, c.Reason = metav1.ConditionFalse, runtimev1alpha1.ReasonUnsupportedPolicy
		c.Message = "inbound traffic refused: not enforced in standalone mode: " + strings.Join(unenforced, "; ")
		// metav1.Condition messages are at most 32768 bytes.
		if len(c.Message) > 32000 {
			c.Message = c.Message[:32000] + "..."
		}
	}
	return c
}

func (e *ConditionWriter) write(ctx context.Context, key types.NamespacedName) error {
	e.mu.Lock()
	unenforced, ok := e.want[key]
	e.mu.Unlock()
	if !ok {
		return nil
	}
	cached := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := e.opts.Reader.Get(ctx, key, cached); err != nil {
		return client.IgnoreNotFound(err)
	}
	_, err := registry.UpdateRegistrationStatus(ctx, e.writer, e.opts.Client, e.opts.Client, cached, func(cur *runtimev1alpha1.WorkloadAutoRegistration) bool {
		prev := meta.FindStatusCondition(cur.Status.Conditions, runtimev1alpha1.ConditionConfigurationEnforced)
		if prev == nil && len(unenforced) == 0 {
			return false // never unenforced: nothing to say
		}
		want := enforcedCondition(unenforced, cur.Generation, e.opts.Now())
		if prev != nil && prev.Status == want.Status && prev.Reason == want.Reason && prev.Message == want.Message {
			return false
		}
		return meta.SetStatusCondition(&cur.Status.Conditions, want)
	})
	if err == nil {
		e.mu.Lock()
		if cur, ok := e.want[key]; ok && slices.Equal(cur, unenforced) {
			delete(e.want, key)
		}
		e.mu.Unlock()
	}
	return err
}
