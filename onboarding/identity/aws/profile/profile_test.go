package profile

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
)

const (
	account  = "123456789012"
	region   = "us-east-2"
	instance = "i-1234567890abcdef0"
	profArn  = "arn:aws:iam::123456789012:instance-profile/vms/ratings-profile"
)

// checker returns a Checker whose real SDK clients talk to a loopback fake
// of EC2 and IAM (the only fake: AWS is a true external edge).
func checker(t *testing.T, fake *awstest.EC2IAM, clock func() time.Time, rate float64, burst int) *Checker {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", fake.AccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", fake.SecretAccessKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	clients, err := NewClients(t.Context(), ClientOptions{EC2Endpoint: fake.URL, IAMEndpoint: fake.URL})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Clients: clients, Options: apicheck.Options{Clock: clock, Rate: rate, Burst: burst}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConfirm(t *testing.T) {
	tests := []struct {
		name    string
		profile string   // associated with the instance; "" none
		roles   []string // of the profile
		role    string   // proven by STS
		wantErr error
	}{
		{name: "the profile carries the proven role", profile: profArn, roles: []string{"ratings-role"}, role: "ratings-role"},
		{name: "no profile associated", role: "ratings-role", wantErr: ErrNoProfile},
		{name: "the profile carries another role", profile: profArn, roles: []string{"other-role"}, role: "ratings-role", wantErr: ErrRoleNotInProfile},
		{name: "a profile with no role", profile: profArn, role: "ratings-role", wantErr: ErrRoleNotInProfile},
		{name: "a profile of another account", profile: "arn:aws:iam::999999999999:instance-profile/ratings-profile", roles: []string{"ratings-role"}, role: "ratings-role", wantErr: ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := awstest.NewEC2IAM()
			defer fake.Close()
			if tt.profile != "" {
				fake.SetProfile(tt.profile, tt.roles...)
				fake.Associate(instance, tt.profile)
			}
			fake.Associate("i-0000000000000000f", profArn) // another instance: filtered out
			err := checker(t, fake, nil, 0, 0).Confirm(t.Context(), account, region, instance, tt.role)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Errorf("Confirm = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestWrongCredentialsAreUnavailable(t *testing.T) {
	fake := awstest.NewEC2IAM()
	defer fake.Close()
	fake.SetProfile(profArn, "ratings-role")
	fake.Associate(instance, profArn)
	c := checker(t, fake, nil, 0, 0)
	fake.SecretAccessKey = "changed" // the fake now refuses the endpoint's signature
	if err := c.Confirm(t.Context(), account, region, instance, "ratings-role"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Confirm with a signature AWS refuses = %v, want ErrUnavailable", err)
	}
}

// Answers are cached for CacheTTL, then asked again (a replaced profile is
// seen), and calls beyond the rate are refused without reaching AWS.
func TestCacheAndRateLimit(t *testing.T) {
	fake := awstest.NewEC2IAM()
	defer fake.Close()
	fake.SetProfile(profArn, "ratings-role")
	fake.Associate(instance, profArn)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	c := checker(t, fake, clock, 0.001, 4)
	ctx := context.Background()
	for range 5 {
		if err := c.Confirm(ctx, account, region, instance, "ratings-role"); err != nil {
			t.Fatal(err)
		}
	}
	if d, g := fake.Calls("DescribeIamInstanceProfileAssociations"), fake.Calls("GetInstanceProfile"); d != 1 || g != 1 {
		t.Errorf("5 checks within the cache time asked EC2 %d and IAM %d times, want 1 and 1", d, g)
	}
	// The profile is replaced by one without the role; after the cache
	// time the check sees it.
	const other = "arn:aws:iam::123456789012:instance-profile/other"
	fake.SetProfile(other, "other-role")
	fake.Associate(instance, other)
	now = now.Add(DefaultCacheTTL)
	if err := c.Confirm(ctx, account, region, instance, "ratings-role"); !errors.Is(err, ErrRoleNotInProfile) {
		t.Errorf("after the profile was replaced: %v, want ErrRoleNotInProfile", err)
	}
	// The burst (4: two calls per uncached check) is spent: a new instance
	// cannot be asked about.
	if err := c.Confirm(ctx, account, region, "i-0000000000000000e", "ratings-role"); !errors.Is(err, ErrRateLimited) {
		t.Errorf("over the rate: %v, want ErrRateLimited", err)
	}
	if d := fake.Calls("DescribeIamInstanceProfileAssociations"); d != 2 {
		t.Errorf("EC2 asked %d times, want 2 (the refused check must not reach it)", d)
	}
}

// The fake EC2/IAM takes one set of credentials for every account, so it
// cannot answer GetInstanceProfile for a name two accounts' profiles share:
// it refuses, naming both accounts, instead of answering either at random.
func TestFakeRefusesAProfileNameOfTwoAccounts(t *testing.T) {
	fake := awstest.NewEC2IAM()
	t.Cleanup(fake.Close)
	c := checker(t, fake, time.Now, 100, 100)
	fake.SetProfile(profArn, "ratings-role")
	fake.SetProfile("arn:aws:iam::210987654321:instance-profile/ratings-profile", "ratings-role")
	fake.Associate(instance, profArn)
	err := c.Confirm(t.Context(), account, region, instance, "ratings-role")
	if err == nil || !strings.Contains(err.Error(), "123456789012 and 210987654321") {
		t.Errorf("Confirm() = %v, want the fake's refusal naming both accounts", err)
	}
}
