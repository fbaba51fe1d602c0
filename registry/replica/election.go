package replica

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// ElectionTiming times an election (client-go leaderelection).
type ElectionTiming struct {
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// Election elects, through one Lease, the replica that leads: one replica
// at a time runs the work given to Run.
type Election struct {
	elector *leaderelection.LeaderElector
	leadCh  chan context.Context
}

// NewElection returns the Election of replica identity through the Lease
// namespace/name.
func NewElection(kube kubernetes.Interface, namespace, name, identity string, timing ElectionTiming, log *slog.Logger) (*Election, error) {
	e := &Election{leadCh: make(chan context.Context)}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: name, Namespace: namespace},
			Client:     kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
		},
		LeaseDuration:   timing.LeaseDuration,
		RenewDeadline:   timing.RenewDeadline,
		RetryPeriod:     timing.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				select {
				case e.leadCh <- ctx:
				case <-ctx.Done():
				}
			},
			OnStoppedLeading: func() {},
			OnNewLeader: func(leader string) {
				log.Info("leader elected", "election", namespace+"/"+name, "leader", leader)
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("election %s/%s: %w", namespace, name, err)
	}
	e.elector = elector
	return e, nil
}

// IsLeader reports whether this replica leads now.
func (e *Election) IsLeader() bool { return e.elector.IsLeader() }

// Run campaigns until ctx ends. While this replica leads it calls lead with
// a context that ends with the term, and campaigns again only once lead has
// returned, so that the work of two terms never overlaps. It returns once
// ctx has ended, the Lease handed over. Call it once.
func (e *Election) Run(ctx context.Context, lead func(context.Context)) {
	for ctx.Err() == nil {
		electionDone := make(chan struct{})
		go func() {
			defer close(electionDone)
			e.elector.Run(ctx)
		}()
		select {
		case leadCtx := <-e.leadCh:
			lead(leadCtx)
			<-electionDone
		case <-electionDone:
		}
	}
}
