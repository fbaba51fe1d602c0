package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// MaxMessageLength bounds Decision.Message in bytes, so that a denial fits a
// Kubernetes Event, a log line and a gRPC status message whatever the
// policies hold. Longer messages are cut and end with "…".
const MaxMessageLength = 1024

const (
	// maxListItems bounds how many items of a list (accounts, zones, labels,
	// selectors, failing attributes) a message shows.
	maxListItems = 8
	// maxValueRunes bounds one value (an issuer URL, a subject) in a message.
	maxValueRunes = 128
)

// Message describes the decision for an operator.
//
// Allowed:
//
//	aws partition aws account 123456789012 region us-east-2 zone us-east-2b instance i-1234567890abcdef0 iam role ratings-role is allowed to join WorkloadGroup bookinfo/ratings by policy allow-narrow/rule 0
//
// Denied, no policy:
//
//	jwt issuer https://idp.example.com subject host-1 is not authorized to join WorkloadGroup bookinfo/ratings: no OnboardingPolicy in namespace bookinfo
//
// Denied by the rules of the namespace's policies, naming the failed
// constraints of the closest rules:
//
//	aws partition aws account 123456789012 region us-east-2 zone us-east-2a instance i-1234567890abcdef0 is not authorized to join WorkloadGroup bookinfo/ratings: no rule of the 1 OnboardingPolicy in namespace bookinfo allows it; closest: policy allow-narrow/rule 0: zone us-east-2a not in [us-east-2b], iam role not proven (policy requires one of [ratings-role])
//
// The message is at most MaxMessageLength bytes.
func (d Decision) Message() string {
	var b strings.Builder
	b.WriteString(DescribeIdentity(d.Identity))
	switch {
	case d.Allowed:
		fmt.Fprintf(&b, " is allowed to join WorkloadGroup %s by %s", d.Group, d.AllowedBy)
	case d.Policies == 0:
		fmt.Fprintf(&b, " is not authorized to join WorkloadGroup %s: no OnboardingPolicy in namespace %s", d.Group, d.Group.Namespace)
	default:
		noun := "OnboardingPolicies"
		if d.Policies == 1 {
			noun = "OnboardingPolicy"
		}
		fmt.Fprintf(&b, " is not authorized to join WorkloadGroup %s: no rule of the %d %s in namespace %s allows it",
			d.Group, d.Policies, noun, d.Group.Namespace)
		for i, f := range d.Closest {
			if i == 0 {
				b.WriteString("; closest: ")
			} else {
				b.WriteString("; ")
			}
			b.WriteString(f.String())
		}
		if d.MoreClosest > 0 {
			fmt.Fprintf(&b, "; and %d more rules as close", d.MoreClosest)
		}
	}
	return truncate(b.String(), MaxMessageLength)
}

// DescribeIdentity describes a workload identity for an operator, e.g.
// "aws partition aws account 123456789012 region us-east-2 zone us-east-2b
// instance i-1234567890abcdef0 iam role ratings-role" (the role only when
// proven), "gcp project my-project zone us-central1-a instance ratings-1
// (5180367924151823417) service account sa@my-project.iam.gserviceaccount.com",
// "azure tenant <tenant> subscription <subscription> resource group embark-rg
// vm ratings-1 (principal <object ID>)" or "jwt issuer https://idp.example.com subject host-1".
func DescribeIdentity(id runtimev1alpha1.WorkloadIdentity) string {
	switch {
	case id.AWS != nil:
		a := id.AWS
		s := fmt.Sprintf("aws partition %s account %s region %s zone %s", clip(a.Partition), clip(a.Account), clip(a.Region), clip(a.Zone))
		if a.EC2 != nil {
			s += " instance " + clip(a.EC2.InstanceID)
			if a.EC2.IAMRole != "" {
				s += " iam role " + clip(a.EC2.IAMRole)
			}
		}
		return s
	case id.JWT != nil:
		return fmt.Sprintf("jwt issuer %s subject %s", clip(id.JWT.Issuer), clip(id.JWT.Subject))
	case id.GCP != nil:
		g := id.GCP
		return fmt.Sprintf("gcp project %s zone %s instance %s (%s) service account %s",
			clip(g.ProjectID), clip(g.Zone), clip(g.InstanceName), clip(g.InstanceID), clip(g.ServiceAccount))
	case id.Azure != nil:
		a := id.Azure
		s := fmt.Sprintf("azure tenant %s subscription %s resource group %s vm %s (principal %s)",
			clip(a.TenantID), clip(a.SubscriptionID), clip(a.ResourceGroup), clip(a.VMName), clip(a.PrincipalID))
		if a.VMConfirmed {
			s += " location " + clip(a.Location)
		}
		return s
	case id.ECS != nil:
		e := id.ECS
		s := fmt.Sprintf("ecs partition %s account %s region %s zone %s cluster %s task %s task role %s",
			clip(e.Partition), clip(e.Account), clip(e.Region), clip(e.Zone), clip(e.Cluster), clip(e.TaskID), clip(e.TaskRole))
		if !e.TaskConfirmed {
			s += " (not confirmed by the ECS API)"
		}
		return s
	default:
		return "a workload without a verified identity"
	}
}

// describeSelector writes a label selector in kubectl's -l syntax, with the
// field it comes from: "matchLabels app=ratings",
// "matchExpressions tier in (backend,frontend),!legacy".
func describeSelector(s *metav1.LabelSelector) string {
	var parts []string
	if len(s.MatchLabels) > 0 {
		parts = append(parts, "matchLabels "+formatLabels(s.MatchLabels))
	}
	if len(s.MatchExpressions) > 0 {
		exprs := make([]string, 0, min(len(s.MatchExpressions), maxListItems+1))
		for i, e := range s.MatchExpressions {
			if i == maxListItems {
				exprs = append(exprs, fmt.Sprintf("(+%d more)", len(s.MatchExpressions)-maxListItems))
				break
			}
			key := clip(e.Key)
			switch e.Operator {
			case metav1.LabelSelectorOpIn:
				exprs = append(exprs, key+" in ("+joinClipped(e.Values, ",")+")")
			case metav1.LabelSelectorOpNotIn:
				exprs = append(exprs, key+" notin ("+joinClipped(e.Values, ",")+")")
			case metav1.LabelSelectorOpExists:
				exprs = append(exprs, key)
			case metav1.LabelSelectorOpDoesNotExist:
				exprs = append(exprs, "!"+key)
			default:
				exprs = append(exprs, key+" "+clip(string(e.Operator))+" ("+joinClipped(e.Values, ",")+")")
			}
		}
		parts = append(parts, "matchExpressions "+strings.Join(exprs, ","))
	}
	if len(parts) == 0 {
		return "{}"
	}
	return strings.Join(parts, " ")
}

// formatLabels writes labels sorted by key as k=v,k=v; "(none)" when empty.
func formatLabels(l map[string]string) string {
	if len(l) == 0 {
		return "(none)"
	}
	keys := slices.Sorted(maps.Keys(l))
	var b strings.Builder
	for i, k := range keys {
		if i == maxListItems {
			fmt.Fprintf(&b, ",(+%d more)", len(keys)-maxListItems)
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(clip(k))
		b.WriteByte('=')
		b.WriteString(clip(l[k]))
	}
	return b.String()
}

// formatList writes a list as [a b c], showing at most maxListItems items.
func formatList[S ~string](items []S) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, it := range items {
		if i == maxListItems {
			fmt.Fprintf(&b, " (+%d more)", len(items)-maxListItems)
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(clip(string(it)))
	}
	b.WriteByte(']')
	return b.String()
}

// joinClipped joins at most maxListItems clipped values with sep.
func joinClipped(values []string, sep string) string {
	var b strings.Builder
	for i, v := range values {
		if i == maxListItems {
			fmt.Fprintf(&b, "%s(+%d more)", sep, len(values)-maxListItems)
			break
		}
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(clip(v))
	}
	return b.String()
}

// joinOr joins alternatives with " or ".
func joinOr(alts []string) string { return strings.Join(alts, " or ") }

// clip shortens a value to maxValueRunes runes, ending it with "…" when cut.
func clip(s string) string {
	if utf8.RuneCountInString(s) <= maxValueRunes {
		return s
	}
	n := 0
	for i := range s {
		if n == maxValueRunes-1 {
			return s[:i] + "…"
		}
		n++
	}
	return s
}

// truncate cuts s to at most limit bytes on a rune boundary, ending it with
// "…" when cut.
func truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	const ellipsis = "…"
	cut := limit - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
