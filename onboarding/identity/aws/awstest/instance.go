package awstest

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

// Instance describes a fake EC2 instance.
type Instance struct {
	// Account is the 12-digit account ID. Default: 123456789012.
	Account string
	// Region. Default: us-east-2.
	Region string
	// Zone is the availability zone. Default: Region + "b".
	Zone string
	// InstanceID. Default: i-1234567890abcdef0.
	InstanceID string
	// PrivateIP. Default: 172.31.5.254.
	PrivateIP string
	// InstanceType. Default: t3.micro.
	InstanceType string
	// ImageID. Default: ami-0123456789abcdef0.
	ImageID string
	// PendingTime. Default: 2021-10-09T10:56:41Z.
	PendingTime time.Time
	// Role is the IAM role of the instance profile; "" for an instance
	// without one.
	Role string
}

func (i Instance) withDefaults() Instance {
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&i.Account, "123456789012")
	def(&i.Region, "us-east-2")
	def(&i.Zone, i.Region+"b")
	def(&i.InstanceID, "i-1234567890abcdef0")
	def(&i.PrivateIP, "172.31.5.254")
	def(&i.InstanceType, "t3.micro")
	def(&i.ImageID, "ami-0123456789abcdef0")
	if i.PendingTime.IsZero() {
		i.PendingTime = time.Date(2021, 10, 9, 10, 56, 41, 0, time.UTC)
	}
	return i
}

// Partition is the AWS partition of the instance's region.
func (i Instance) Partition() string {
	return awswire.PartitionForRegion(i.withDefaults().Region)
}

// RoleARN is the ARN STS answers for the instance profile's role session:
// arn:<partition>:sts::<account>:assumed-role/<role>/<instance-id>.
func (i Instance) RoleARN() string {
	i = i.withDefaults()
	return AssumedRoleARN(i.Partition(), i.Account, i.Role, i.InstanceID)
}

// AssumedRoleARN formats an STS assumed-role ARN.
func AssumedRoleARN(partition, account, role, session string) string {
	return fmt.Sprintf("arn:%s:sts::%s:assumed-role/%s/%s", partition, account, role, session)
}

// Document renders the instance identity document in the layout IMDS uses
// (two-space indent, " : " between key and value, no final newline).
func (i Instance) Document() []byte {
	i = i.withDefaults()
	str := func(s string) string {
		b, _ := json.Marshal(s) // a string always marshals
		return string(b)
	}
	fields := []struct{ key, value string }{
		{"accountId", str(i.Account)},
		{"architecture", str("x86_64")},
		{"availabilityZone", str(i.Zone)},
		{"billingProducts", "null"},
		{"devpayProductCodes", "null"},
		{"marketplaceProductCodes", "null"},
		{"imageId", str(i.ImageID)},
		{"instanceId", str(i.InstanceID)},
		{"instanceType", str(i.InstanceType)},
		{"kernelId", "null"},
		{"pendingTime", str(i.PendingTime.UTC().Format(time.RFC3339))},
		{"privateIp", str(i.PrivateIP)},
		{"ramdiskId", "null"},
		{"region", str(i.Region)},
		{"version", str("2017-09-30")},
	}
	var b strings.Builder
	b.WriteString("{\n")
	for n, f := range fields {
		fmt.Fprintf(&b, "  %q : %s", f.key, f.value)
		if n < len(fields)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("}")
	return []byte(b.String())
}
