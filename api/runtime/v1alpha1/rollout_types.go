package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Condition types and reasons of a WorkloadGroupRollout.
const (
	// RolloutConditionProgressing is True while out-of-date workloads are
	// being re-onboarded, False once none is left (reason RolloutComplete)
	// or when the rollout cannot proceed.
	RolloutConditionProgressing = "Progressing"
	// RolloutConditionPaused is True while the rollout starts no new
	// batch: spec.paused is set, by the operator (PausedByUser) or by the
	// lifecycle when a workload was not back within the progress deadline
	// (ProgressDeadlineExceeded).
	RolloutConditionPaused = "Paused"

	ReasonRolloutComplete          = "RolloutComplete"
	ReasonBatchInProgress          = "BatchInProgress"
	ReasonRolloutPaused            = "RolloutPaused"
	ReasonWorkloadGroupNotFound    = "WorkloadGroupNotFound"
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	ReasonPausedByUser             = "PausedByUser"
	ReasonNotPaused                = "NotPaused"
	// ReasonRolloutReonboard (Event): a workload was asked to onboard again.
	ReasonRolloutReonboard = "RolloutReonboard"
)

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=wgr,categories=embark
// +kubebuilder:printcolumn:name="Group",type=string,JSONPath=`.spec.workloadGroup`,description="The WorkloadGroup rolled out"
// +kubebuilder:printcolumn:name="Max Unavailable",type=string,JSONPath=`.spec.maxUnavailable`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.updated`,description="Workloads with the WorkloadGroup's current spec"
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.total`,description="Workloads of the WorkloadGroup"
// +kubebuilder:printcolumn:name="Batch",type=integer,JSONPath=`.status.batch.number`,description="The batch being re-onboarded"
// +kubebuilder:printcolumn:name="Paused",type=string,JSONPath=`.spec.paused`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Progressing")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// WorkloadGroupRollout opts a WorkloadGroup in to rolling updates: when the
// group's spec changes, the sweeping endpoint replica asks its connected,
// out-of-date workloads to onboard again, at most maxUnavailable at a time,
// starting the next batch only when the previous one is connected again
// (and Healthy where the group has a probe).
type WorkloadGroupRollout struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec WorkloadGroupRolloutSpec `json:"spec"`
	// +optional
	Status WorkloadGroupRolloutStatus `json:"status,omitempty"`
}

// WorkloadGroupRolloutSpec says which group is rolled out and how.
type WorkloadGroupRolloutSpec struct {
	// WorkloadGroup is the name of the WorkloadGroup, in the rollout's
	// namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	WorkloadGroup string `json:"workloadGroup"`
	// MaxUnavailable is how many workloads may be re-onboarding at once: a
	// number, or a percentage of the group's workloads (rounded down, at
	// least 1). Default 1.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^[1-9][0-9]?%$|^100%$')",message="a number of at least 1, or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// ProgressDeadlineSeconds is how long a batch may take to come back
	// (connected again, and Healthy where the group has a probe) before
	// the rollout pauses. Default 600.
	// +optional
	// +kubebuilder:validation:Minimum=1
	ProgressDeadlineSeconds *int32 `json:"progressDeadlineSeconds,omitempty"`
	// Paused stops new batches. The lifecycle sets it when a batch misses
	// its deadline; set it to false to resume (the batch gets a new
	// deadline).
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// WorkloadGroupRolloutStatus is the rollout's progress, kept in the API so
// that another replica taking over the sweeping continues where it stopped.
type WorkloadGroupRolloutStatus struct {
	// ObservedGeneration is the rollout generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// WorkloadGroupGeneration is the generation of the WorkloadGroup being
	// rolled out.
	// +optional
	WorkloadGroupGeneration int64 `json:"workloadGroupGeneration,omitempty"`
	// Total is the number of the group's workloads; Updated how many have
	// its current spec; Skipped how many are out of date but disconnected
	// (they are not asked; they take part once they reconnect).
	// +optional
	Total int32 `json:"total"`
	// +optional
	Updated int32 `json:"updated"`
	// +optional
	Skipped int32 `json:"skipped,omitempty"`
	// Batch is the batch being re-onboarded, if any.
	// +optional
	Batch *RolloutBatch `json:"batch,omitempty"`
	// Batches counts the batches started so far.
	// +optional
	Batches int32 `json:"batches,omitempty"`
	// Conditions: Progressing, Paused.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RolloutBatch is a set of workloads asked to onboard again together.
type RolloutBatch struct {
	// Number counts batches from 1.
	Number int32 `json:"number"`
	// StartedAt is when the batch was asked to onboard again; its deadline
	// runs from here (and from the resume after a pause).
	StartedAt metav1.Time `json:"startedAt"`
	// DeadlineExceeded is set once the batch missed its deadline and the
	// rollout was paused for it.
	// +optional
	DeadlineExceeded bool `json:"deadlineExceeded,omitempty"`
	// Workloads are the registrations asked to onboard again.
	// +kubebuilder:validation:MaxItems=1000
	Workloads []RolloutWorkload `json:"workloads"`
}

// RolloutWorkload is one workload of a batch.
type RolloutWorkload struct {
	// Name of its WorkloadAutoRegistration.
	Name string `json:"name"`
	// PreviousUID is the UID of the registration it was asked to leave: the
	// workload is back with a registration of another UID.
	PreviousUID types.UID `json:"previousUID"`
	// Back is set once it is connected again with the group's current spec
	// (and Healthy where the group has a probe).
	// +optional
	Back bool `json:"back,omitempty"`
}

// +kubebuilder:object:root=true

// WorkloadGroupRolloutList is a list of WorkloadGroupRollouts.
type WorkloadGroupRolloutList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WorkloadGroupRollout `json:"items"`
}
