package policy

import (
	"fmt"
	"math/bits"
	"path"
	"slices"
	"strings"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// failure is a set of constraints of one workloads[] matcher that an identity
// fails.
type failure uint32

const (
	// failKind: the matcher is for another kind of identity (aws, jwt,
	// gcp, azure), or the identity has none.
	failKind failure = 1 << iota
	// failMalformed: the matcher sets none or more than one of aws, jwt,
	// gcp and azure (admission refuses this; it never matches).
	failMalformed
	failPartition
	failAccount
	failRegion
	failZone
	failNotEC2
	failRoleUnproven
	failRole
	failIssuer
	failSubject
	failAttribute
	// failEmptyList: the matcher holds a list that is present but empty
	// (admission refuses this); "[]" never means "anything".
	failEmptyList
	failProject
	failServiceAccount
	failInstanceName
	failTenant
	failSubscription
	failResourceGroup
	failCluster
	// failUnconfirmed: an ecs rule names regions, zones or clusters and the
	// ECS API did not confirm the task, or an azure rule names locations and
	// Azure Resource Manager did not confirm the VM.
	failUnconfirmed
	failLocation
)

// farAway is the distance of a matcher that cannot match this kind of
// identity at all, so that rules for the right kind of identity are always
// closer.
const farAway = 1 << 10

// distance is how far a failure set is from a match: the number of failed
// constraints, or farAway for a matcher of the wrong kind.
func (f failure) distance() int {
	if f&(failKind|failMalformed) != 0 {
		return farAway
	}
	return bits.OnesCount32(uint32(f))
}

// closestWorkload returns the index of the first matcher with the smallest
// distance to id, that distance (0 = match), and whether some matcher fails
// only for want of a proven IAM role (roleOnly) or only for want of the
// platform API's confirmation (confirmOnly).
func closestWorkload(ws []authorizationv1alpha1.WorkloadMatcher, id runtimev1alpha1.WorkloadIdentity) (index, dist int, roleOnly, confirmOnly bool) {
	dist = farAway + 1
	for i := range ws {
		f := matchWorkload(&ws[i], id)
		roleOnly = roleOnly || f == failRoleUnproven
		confirmOnly = confirmOnly || f == failUnconfirmed
		if d := f.distance(); d < dist {
			index, dist = i, d
			if d == 0 {
				return index, 0, roleOnly, confirmOnly
			}
		}
	}
	return index, dist, roleOnly, confirmOnly
}

// matchWorkload returns the constraints of m that id fails; 0 is a match.
func matchWorkload(m *authorizationv1alpha1.WorkloadMatcher, id runtimev1alpha1.WorkloadIdentity) failure {
	switch {
	case matcherKinds(m) != 1:
		return failMalformed
	case m.AWS != nil:
		return matchAWS(m.AWS, id.AWS)
	case m.GCP != nil:
		return matchGCP(m.GCP, id.GCP)
	case m.Azure != nil:
		return matchAzure(m.Azure, id.Azure)
	case m.ECS != nil:
		return matchECS(m.ECS, id.ECS)
	default:
		return matchJWT(m.JWT, id.JWT)
	}
}

// matcherKinds counts the kinds of identity m sets (one is valid).
func matcherKinds(m *authorizationv1alpha1.WorkloadMatcher) int {
	n := 0
	for _, set := range []bool{m.AWS != nil, m.JWT != nil, m.GCP != nil, m.Azure != nil, m.ECS != nil} {
		if set {
			n++
		}
	}
	return n
}

// matchECS returns the constraints of an ecs matcher that id fails.
func matchECS(m *authorizationv1alpha1.ECSMatcher, id *runtimev1alpha1.ECSIdentity) failure {
	if id == nil {
		return failKind
	}
	var f failure
	if emptyList(m.Regions) || emptyList(m.Zones) || emptyList(m.Clusters) || emptyList(m.TaskRoles) {
		f |= failEmptyList
	}
	// Accounts are never a wildcard: an empty list matches no account.
	if !slices.Contains(m.Accounts, id.Account) {
		f |= failAccount
	}
	if len(m.Regions) > 0 && !slices.Contains(m.Regions, id.Region) {
		f |= failRegion
	}
	if len(m.Zones) > 0 && !slices.Contains(m.Zones, id.Zone) {
		f |= failZone
	}
	if len(m.Clusters) > 0 && !slices.Contains(m.Clusters, id.Cluster) {
		f |= failCluster
	}
	if len(m.TaskRoles) > 0 && !slices.Contains(m.TaskRoles, id.TaskRole) {
		f |= failRole
	}
	if ecsNeedsConfirmation(m) && !id.TaskConfirmed {
		f |= failUnconfirmed
	}
	return f
}

// ecsNeedsConfirmation says whether m constrains what only the ECS API
// confirms: the task's region, zone and cluster are the agent's claim
// otherwise (STS proves the account, the role and the task ID).
func ecsNeedsConfirmation(m *authorizationv1alpha1.ECSMatcher) bool {
	return m.Regions != nil || m.Zones != nil || m.Clusters != nil
}

// ecsReasons describes every constraint of an ecs matcher that id fails.
func ecsReasons(e *authorizationv1alpha1.ECSMatcher, id runtimev1alpha1.WorkloadIdentity) []string {
	ide := id.ECS
	if ide == nil {
		return []string{fmt.Sprintf("rule matches ecs tasks, identity is %s", identityKind(id))}
	}
	var out []string
	if emptyList(e.Regions) || emptyList(e.Zones) || emptyList(e.Clusters) || emptyList(e.TaskRoles) {
		out = append(out, "an empty list (regions, zones, clusters or taskRoles: []) matches nothing")
	}
	if !slices.Contains(e.Accounts, ide.Account) {
		out = append(out, fmt.Sprintf("account %s not in %s", clip(ide.Account), formatList(e.Accounts)))
	}
	if len(e.Regions) > 0 && !slices.Contains(e.Regions, ide.Region) {
		out = append(out, fmt.Sprintf("region %s not in %s", clip(ide.Region), formatList(e.Regions)))
	}
	if len(e.Zones) > 0 && !slices.Contains(e.Zones, ide.Zone) {
		out = append(out, fmt.Sprintf("zone %s not in %s", clip(ide.Zone), formatList(e.Zones)))
	}
	if len(e.Clusters) > 0 && !slices.Contains(e.Clusters, ide.Cluster) {
		out = append(out, fmt.Sprintf("cluster %s not in %s", clip(ide.Cluster), formatList(e.Clusters)))
	}
	if len(e.TaskRoles) > 0 && !slices.Contains(e.TaskRoles, ide.TaskRole) {
		out = append(out, fmt.Sprintf("task role %s not in %s", clip(ide.TaskRole), formatList(e.TaskRoles)))
	}
	if ecsNeedsConfirmation(e) && !ide.TaskConfirmed {
		out = append(out, "task not confirmed by the ECS API (the rule names regions, zones or clusters; the endpoint needs identity.ecs.taskCheck)")
	}
	return out
}

func matchGCP(m *authorizationv1alpha1.GCPMatcher, id *runtimev1alpha1.GCPIdentity) failure {
	if id == nil {
		return failKind
	}
	var f failure
	if emptyList(m.Zones) || emptyList(m.ServiceAccounts) || emptyList(m.InstanceNamePatterns) {
		f |= failEmptyList
	}
	// Projects are never a wildcard: an empty list matches no project.
	if !slices.Contains(m.Projects, id.ProjectID) {
		f |= failProject
	}
	if len(m.Zones) > 0 && !slices.Contains(m.Zones, id.Zone) {
		f |= failZone
	}
	if len(m.ServiceAccounts) > 0 && !slices.Contains(m.ServiceAccounts, id.ServiceAccount) {
		f |= failServiceAccount
	}
	if len(m.InstanceNamePatterns) > 0 && !namePatternsMatch(m.InstanceNamePatterns, id.InstanceName) {
		f |= failInstanceName
	}
	return f
}

func matchAzure(m *authorizationv1alpha1.AzureMatcher, id *runtimev1alpha1.AzureIdentity) failure {
	if id == nil {
		return failKind
	}
	var f failure
	if emptyList(m.ResourceGroups) || emptyList(m.Locations) {
		f |= failEmptyList
	}
	// Tenants and subscriptions are never a wildcard: an empty list matches
	// nothing. Identities hold them in lower case; a policy may not.
	if !containsFold(m.Tenants, id.TenantID) {
		f |= failTenant
	}
	if !containsFold(m.Subscriptions, id.SubscriptionID) {
		f |= failSubscription
	}
	if len(m.ResourceGroups) > 0 && !containsFold(m.ResourceGroups, id.ResourceGroup) {
		f |= failResourceGroup
	}
	// Only Azure Resource Manager says where a VM is: an unconfirmed VM
	// has no location to compare.
	switch {
	case m.Locations == nil:
	case !id.VMConfirmed:
		f |= failUnconfirmed
	case !containsFold(m.Locations, id.Location):
		f |= failLocation
	}
	return f
}

// containsFold reports whether list holds s, compared without case (as
// Azure compares IDs and names).
func containsFold(list []string, s string) bool {
	return slices.ContainsFunc(list, func(e string) bool { return strings.EqualFold(e, s) })
}

// azureReasons describes every constraint of an azure matcher that id
// fails.
func azureReasons(a *authorizationv1alpha1.AzureMatcher, id runtimev1alpha1.WorkloadIdentity) []string {
	ida := id.Azure
	if ida == nil {
		return []string{fmt.Sprintf("rule matches azure workloads, identity is %s", identityKind(id))}
	}
	var out []string
	if emptyList(a.ResourceGroups) {
		out = append(out, "an empty list (resourceGroups: []) matches nothing")
	}
	if emptyList(a.Locations) {
		out = append(out, "an empty list (locations: []) matches nothing")
	}
	if !containsFold(a.Tenants, ida.TenantID) {
		out = append(out, fmt.Sprintf("tenant %s not in %s", clip(ida.TenantID), formatList(a.Tenants)))
	}
	if !containsFold(a.Subscriptions, ida.SubscriptionID) {
		out = append(out, fmt.Sprintf("subscription %s not in %s", clip(ida.SubscriptionID), formatList(a.Subscriptions)))
	}
	if len(a.ResourceGroups) > 0 && !containsFold(a.ResourceGroups, ida.ResourceGroup) {
		out = append(out, fmt.Sprintf("resource group %s not in %s", clip(ida.ResourceGroup), formatList(a.ResourceGroups)))
	}
	switch {
	case a.Locations == nil:
	case !ida.VMConfirmed:
		out = append(out, "VM not confirmed by Azure Resource Manager (the rule names locations; the endpoint needs identity.azure.vmCheck)")
	case !containsFold(a.Locations, ida.Location):
		out = append(out, fmt.Sprintf("location %s not in %s", clip(ida.Location), formatList(a.Locations)))
	}
	return out
}

// namePatternsMatch reports whether name matches one of the path.Match
// patterns; a malformed pattern matches nothing.
func namePatternsMatch(patterns []string, name string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool {
		ok, err := path.Match(p, name)
		return err == nil && ok
	})
}

func matchAWS(m *authorizationv1alpha1.AWSMatcher, id *runtimev1alpha1.AWSIdentity) failure {
	if id == nil {
		return failKind
	}
	var f failure
	if emptyList(m.Partitions) || emptyList(m.Regions) || emptyList(m.Zones) || (m.EC2 != nil && emptyList(m.EC2.IAMRoleNames)) {
		f |= failEmptyList
	}
	if len(m.Partitions) > 0 && !slices.Contains(m.Partitions, authorizationv1alpha1.AWSPartition(id.Partition)) {
		f |= failPartition
	}
	// Accounts are never a wildcard: an empty list matches no account.
	if !slices.Contains(m.Accounts, id.Account) {
		f |= failAccount
	}
	if len(m.Regions) > 0 && !slices.Contains(m.Regions, id.Region) {
		f |= failRegion
	}
	if len(m.Zones) > 0 && !slices.Contains(m.Zones, id.Zone) {
		f |= failZone
	}
	if m.EC2 != nil {
		switch {
		case id.EC2 == nil:
			f |= failNotEC2
		case len(m.EC2.IAMRoleNames) == 0 && !m.EC2.RequireSTSProof:
		case id.EC2.IAMRole == "":
			f |= failRoleUnproven
		case len(m.EC2.IAMRoleNames) == 0:
		case !slices.Contains(m.EC2.IAMRoleNames, id.EC2.IAMRole):
			f |= failRole
		}
	}
	return f
}

func matchJWT(m *authorizationv1alpha1.JWTMatcher, id *runtimev1alpha1.JWTIdentity) failure {
	if id == nil {
		return failKind
	}
	var f failure
	if emptyList(m.Subjects) || emptyList(m.Attributes) {
		f |= failEmptyList
	}
	if id.Issuer != m.Issuer {
		f |= failIssuer
	}
	if len(m.Subjects) > 0 && !slices.Contains(m.Subjects, id.Subject) {
		f |= failSubject
	}
	for i := range m.Attributes {
		a := &m.Attributes[i]
		v, ok := id.Attributes[a.Name]
		if !ok || !slices.Contains(a.Values, v) {
			f |= failAttribute
			break
		}
	}
	return f
}

// emptyList reports a list that is present but empty ("[]", as decoded from
// JSON): admission refuses it; evaluation treats it as matching nothing.
func emptyList[T any](l []T) bool { return l != nil && len(l) == 0 }

// workloadReasons describes, for an operator, every constraint of m that id
// fails. It is only called for the few rules a Decision reports.
func workloadReasons(m *authorizationv1alpha1.WorkloadMatcher, id runtimev1alpha1.WorkloadIdentity) []string {
	var out []string
	switch {
	case matcherKinds(m) > 1:
		return []string{"matcher sets more than one of aws, jwt, gcp, azure and ecs"}
	case matcherKinds(m) == 0:
		return []string{"matcher sets none of aws, jwt, gcp, azure and ecs"}
	case m.GCP != nil:
		return gcpReasons(m.GCP, id)
	case m.Azure != nil:
		return azureReasons(m.Azure, id)
	case m.ECS != nil:
		return ecsReasons(m.ECS, id)
	case m.AWS != nil:
		a, ida := m.AWS, id.AWS
		if ida == nil {
			return []string{fmt.Sprintf("rule matches aws workloads, identity is %s", identityKind(id))}
		}
		if emptyList(a.Partitions) || emptyList(a.Regions) || emptyList(a.Zones) || (a.EC2 != nil && emptyList(a.EC2.IAMRoleNames)) {
			out = append(out, "an empty list (partitions, regions, zones or ec2.iamRoleNames: []) matches nothing")
		}
		if len(a.Partitions) > 0 && !slices.Contains(a.Partitions, authorizationv1alpha1.AWSPartition(ida.Partition)) {
			out = append(out, fmt.Sprintf("partition %s not in %s", clip(ida.Partition), formatList(a.Partitions)))
		}
		if !slices.Contains(a.Accounts, ida.Account) {
			out = append(out, fmt.Sprintf("account %s not in %s", clip(ida.Account), formatList(a.Accounts)))
		}
		if len(a.Regions) > 0 && !slices.Contains(a.Regions, ida.Region) {
			out = append(out, fmt.Sprintf("region %s not in %s", clip(ida.Region), formatList(a.Regions)))
		}
		if len(a.Zones) > 0 && !slices.Contains(a.Zones, ida.Zone) {
			out = append(out, fmt.Sprintf("zone %s not in %s", clip(ida.Zone), formatList(a.Zones)))
		}
		if a.EC2 != nil {
			switch {
			case ida.EC2 == nil:
				out = append(out, "not an EC2 instance (rule requires ec2)")
			case len(a.EC2.IAMRoleNames) == 0 && !a.EC2.RequireSTSProof:
			case ida.EC2.IAMRole == "" && len(a.EC2.IAMRoleNames) == 0:
				out = append(out, "iam role not proven (policy requires an STS proof: requireSTSProof)")
			case ida.EC2.IAMRole == "":
				out = append(out, fmt.Sprintf("iam role not proven (policy requires one of %s)", formatList(a.EC2.IAMRoleNames)))
			case len(a.EC2.IAMRoleNames) == 0:
			case !slices.Contains(a.EC2.IAMRoleNames, ida.EC2.IAMRole):
				out = append(out, fmt.Sprintf("iam role %s not in %s", clip(ida.EC2.IAMRole), formatList(a.EC2.IAMRoleNames)))
			}
		}
	default:
		j, idj := m.JWT, id.JWT
		if idj == nil {
			return []string{fmt.Sprintf("rule matches jwt issuer %s, identity is %s", clip(j.Issuer), identityKind(id))}
		}
		if emptyList(j.Subjects) || emptyList(j.Attributes) {
			out = append(out, "an empty list (subjects or attributes: []) matches nothing")
		}
		if idj.Issuer != j.Issuer {
			out = append(out, fmt.Sprintf("issuer %s is not %s", clip(idj.Issuer), clip(j.Issuer)))
		}
		if len(j.Subjects) > 0 && !slices.Contains(j.Subjects, idj.Subject) {
			out = append(out, fmt.Sprintf("subject %s not in %s", clip(idj.Subject), formatList(j.Subjects)))
		}
		failed := 0
		for i := range j.Attributes {
			a := &j.Attributes[i]
			v, ok := idj.Attributes[a.Name]
			if ok && slices.Contains(a.Values, v) {
				continue
			}
			failed++
			switch {
			case failed > maxListItems:
				// Bounded: the rest are counted in one reason below.
			case !ok:
				out = append(out, fmt.Sprintf("attribute %s missing (policy requires one of %s)", clip(a.Name), formatList(a.Values)))
			default:
				out = append(out, fmt.Sprintf("attribute %s=%s not in %s", clip(a.Name), clip(v), formatList(a.Values)))
			}
		}
		if failed > maxListItems {
			out = append(out, fmt.Sprintf("(+%d more attributes)", failed-maxListItems))
		}
	}
	return out
}

// gcpReasons describes every constraint of a gcp matcher that id fails.
func gcpReasons(g *authorizationv1alpha1.GCPMatcher, id runtimev1alpha1.WorkloadIdentity) []string {
	idg := id.GCP
	if idg == nil {
		return []string{fmt.Sprintf("rule matches gcp workloads, identity is %s", identityKind(id))}
	}
	var out []string
	if emptyList(g.Zones) || emptyList(g.ServiceAccounts) || emptyList(g.InstanceNamePatterns) {
		out = append(out, "an empty list (zones, serviceAccounts or instanceNamePatterns: []) matches nothing")
	}
	if !slices.Contains(g.Projects, idg.ProjectID) {
		out = append(out, fmt.Sprintf("project %s not in %s", clip(idg.ProjectID), formatList(g.Projects)))
	}
	if len(g.Zones) > 0 && !slices.Contains(g.Zones, idg.Zone) {
		out = append(out, fmt.Sprintf("zone %s not in %s", clip(idg.Zone), formatList(g.Zones)))
	}
	if len(g.ServiceAccounts) > 0 && !slices.Contains(g.ServiceAccounts, idg.ServiceAccount) {
		out = append(out, fmt.Sprintf("service account %s not in %s", clip(idg.ServiceAccount), formatList(g.ServiceAccounts)))
	}
	if len(g.InstanceNamePatterns) > 0 && !namePatternsMatch(g.InstanceNamePatterns, idg.InstanceName) {
		out = append(out, fmt.Sprintf("instance name %s matches none of %s", clip(idg.InstanceName), formatList(g.InstanceNamePatterns)))
	}
	return out
}

// groupReason describes why no target selects the group.
func groupReason(targets []authorizationv1alpha1.OnboardTarget, group GroupRef) string {
	sels := make([]string, 0, min(len(targets), maxListItems))
	for i := range targets {
		if i == maxListItems {
			sels = append(sels, fmt.Sprintf("(+%d more selectors)", len(targets)-maxListItems))
			break
		}
		s := &targets[i].WorkloadGroupSelector
		if _, err := selectorOf(s); err != nil {
			sels = append(sels, fmt.Sprintf("invalid onboardTo[%d].workloadGroupSelector (%s)", i, clip(err.Error())))
			continue
		}
		sels = append(sels, describeSelector(s))
	}
	if len(sels) == 0 {
		return "rule lists no onboardTo targets"
	}
	return fmt.Sprintf("WorkloadGroup labels %s not selected by %s", formatLabels(group.Labels), joinOr(sels))
}

func identityKind(id runtimev1alpha1.WorkloadIdentity) string {
	switch {
	case id.AWS != nil:
		return "aws"
	case id.JWT != nil:
		return "jwt"
	case id.GCP != nil:
		return "gcp"
	case id.Azure != nil:
		return "azure"
	case id.ECS != nil:
		return "ecs"
	default:
		return "empty"
	}
}
