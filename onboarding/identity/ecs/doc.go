// Package ecs verifies the identity of an AWS ECS task: a signed
// sts:GetCallerIdentity request made with the task role's credentials (the
// role session ECS creates for the task and names after the task ID), bound
// to the onboarding endpoint and checked, sent to STS and refused on replay
// exactly as an EC2 instance's STS proof is (package aws, VerifyCaller), and
// the task the agent read from the task metadata endpoint v4. STS's answer
// must be an assumed-role session of the task's account and partition whose
// name is the claimed task's ID.
//
// Optionally a [TaskChecker] confirms the task with the ECS API
// (DescribeTasks, and DescribeTaskDefinition for the task role when the task
// does not override it): the task exists, is RUNNING, runs in the claimed
// cluster and zone with the proven role, and its ENI's private address is
// the claimed address. Only a confirmed task proves its address, cluster and
// zone; without the check they are the agent's claim.
package ecs
