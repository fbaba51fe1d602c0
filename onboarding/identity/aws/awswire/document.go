package awswire

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// MaxDocumentSize bounds the instance identity document; real documents are
// about 500 bytes.
const MaxDocumentSize = 16 << 10

// Document is the part of an EC2 instance identity document that Embark
// uses. Only a document whose signature verified may be believed.
type Document struct {
	AccountID        string `json:"accountId"`
	Architecture     string `json:"architecture"`
	AvailabilityZone string `json:"availabilityZone"`
	ImageID          string `json:"imageId"`
	InstanceID       string `json:"instanceId"`
	InstanceType     string `json:"instanceType"`
	PendingTime      string `json:"pendingTime"`
	PrivateIP        string `json:"privateIp"`
	Region           string `json:"region"`
	Version          string `json:"version"`
}

var (
	accountPattern  = regexp.MustCompile(`^[0-9]{12}$`)
	instancePattern = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)
	zoneSuffix      = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)
	// regionPattern matches AWS region names (us-east-1, cn-north-1,
	// us-gov-west-1, eusc-de-east-1, us-isob-east-1, ...).
	regionPattern = regexp.MustCompile(`^[a-z]{2,5}(-[a-z]+)+-[0-9]{1,2}$`)
)

// IsRegionName reports whether s has the shape of an AWS region name.
func IsRegionName(s string) bool { return regionPattern.MatchString(s) }

// IsAccountID reports whether s is a 12-digit AWS account ID.
func IsAccountID(s string) bool { return accountPattern.MatchString(s) }

// ParseDocument parses an instance identity document and checks that the
// fields Embark relies on are present and well-formed: a 12-digit account,
// an instance ID i-<8 to 17 hex digits>, a region name, and an availability
// zone of that region (the zone and instance end up in resource names). It
// verifies nothing.
func ParseDocument(data []byte) (*Document, error) {
	if len(data) == 0 {
		return nil, errors.New("empty")
	}
	if len(data) > MaxDocumentSize {
		return nil, fmt.Errorf("%d bytes, more than %d", len(data), MaxDocumentSize)
	}
	var doc Document
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("not a JSON object of the expected shape: %w", err)
	}
	if !IsAccountID(doc.AccountID) {
		return nil, fmt.Errorf("accountId %q is not a 12-digit AWS account ID", doc.AccountID)
	}
	if !instancePattern.MatchString(doc.InstanceID) {
		return nil, fmt.Errorf("instanceId %q is not an EC2 instance ID", doc.InstanceID)
	}
	if !IsRegionName(doc.Region) {
		return nil, fmt.Errorf("region %q is not an AWS region name", doc.Region)
	}
	suffix, ok := strings.CutPrefix(doc.AvailabilityZone, doc.Region)
	if !ok || !zoneSuffix.MatchString(suffix) {
		return nil, fmt.Errorf("availabilityZone %q is not a zone of region %s", doc.AvailabilityZone, doc.Region)
	}
	return &doc, nil
}

// Partition returns the AWS partition of the document's region.
func (d *Document) Partition() string { return PartitionForRegion(d.Region) }

// PendingTimeOrZero parses PendingTime, informational only: the zero time
// if it is absent or not RFC 3339. A document's age is not a reason to
// refuse it.
func (d *Document) PendingTimeOrZero() time.Time {
	t, err := time.Parse(time.RFC3339, d.PendingTime)
	if err != nil {
		return time.Time{}
	}
	return t
}

// PartitionForRegion derives the AWS partition from a region name: aws-cn
// for cn-*, aws-us-gov for us-gov-*, aws-eusc for eusc-*, aws-iso for
// us-iso-*, aws-iso-b for us-isob-*, aws-iso-e for eu-isoe-*, aws-iso-f for
// us-isof-*, and aws for every other region.
func PartitionForRegion(region string) string {
	switch {
	case strings.HasPrefix(region, "cn-"):
		return "aws-cn"
	case strings.HasPrefix(region, "us-gov-"):
		return "aws-us-gov"
	case strings.HasPrefix(region, "eusc-"):
		return "aws-eusc"
	case strings.HasPrefix(region, "us-isob-"):
		return "aws-iso-b"
	case strings.HasPrefix(region, "us-isof-"):
		return "aws-iso-f"
	case strings.HasPrefix(region, "eu-isoe-"):
		return "aws-iso-e"
	case strings.HasPrefix(region, "us-iso-"):
		return "aws-iso"
	default:
		return "aws"
	}
}

func (d *Document) String() string {
	return fmt.Sprintf("instance %s of account %s in %s", d.InstanceID, d.AccountID, d.AvailabilityZone)
}
