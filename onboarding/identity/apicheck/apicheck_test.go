package apicheck

import (
	"context"
	"errors"
	"testing"
	"time"
)

type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func TestCacheExpiresAnswers(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	cache := NewCache[string, int](10, c.Now)
	cache.Put("a", 1, 30*time.Second)
	if v, ok := cache.Get("a"); !ok || v != 1 {
		t.Fatalf("Get(a) = %d, %v; want 1, true", v, ok)
	}
	c.now = c.now.Add(29 * time.Second)
	if _, ok := cache.Get("a"); !ok {
		t.Fatal("answer gone before its time to live")
	}
	c.now = c.now.Add(time.Second)
	if _, ok := cache.Get("a"); ok {
		t.Fatal("answer served at its expiry")
	}
	if _, ok := cache.Get("b"); ok {
		t.Fatal("answer for a key never stored")
	}
}

func TestCacheStaysWithinItsBound(t *testing.T) {
	tests := []struct {
		name    string
		expired bool
	}{
		{name: "expired answers dropped first", expired: true},
		{name: "live answers dropped when none expired", expired: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{now: time.Unix(1000, 0)}
			cache := NewCache[int, int](3, c.Now)
			for k := range 3 {
				cache.Put(k, k, time.Minute)
			}
			if tt.expired {
				c.now = c.now.Add(time.Hour)
			}
			cache.Put(99, 99, time.Minute)
			if n := cache.Len(); n > 3 {
				t.Fatalf("cache holds %d answers, bound 3", n)
			}
			if v, ok := cache.Get(99); !ok || v != 99 {
				t.Fatalf("the answer just stored: %d, %v", v, ok)
			}
			if tt.expired && cache.Len() != 1 {
				t.Fatalf("expired answers kept: %d held, want 1", cache.Len())
			}
		})
	}
}

func TestCacheReplacesAKeyWithoutDropping(t *testing.T) {
	cache := NewCache[string, int](2, nil)
	cache.Put("a", 1, time.Minute)
	cache.Put("b", 2, time.Minute)
	cache.Put("a", 3, time.Minute)
	if v, _ := cache.Get("a"); v != 3 {
		t.Fatalf("Get(a) = %d, want 3", v)
	}
	if _, ok := cache.Get("b"); !ok {
		t.Fatal("replacing a key dropped another")
	}
}

func TestCallsRateLimitAndTimeout(t *testing.T) {
	errMine := errors.New("my check's limit")
	c := &clock{now: time.Unix(1000, 0)}
	calls := NewCalls(CallOptions{Rate: 1, Burst: 2, Timeout: time.Minute, Clock: c.Now, Limited: errMine})
	for i := range 2 {
		ctx, cancel, err := calls.Start(context.Background())
		if err != nil {
			t.Fatalf("call %d within the burst: %v", i+1, err)
		}
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > time.Minute {
			t.Errorf("call %d: deadline %v, %v; want within the timeout", i+1, d, ok)
		}
		cancel()
	}
	if _, _, err := calls.Start(context.Background()); !errors.Is(err, errMine) {
		t.Fatalf("call over the burst: %v, want the check's own error", err)
	}
	c.now = c.now.Add(time.Second)
	if _, cancel, err := calls.Start(context.Background()); err != nil {
		t.Fatalf("call a second later: %v", err)
	} else {
		cancel()
	}
}

func TestCallsDefaults(t *testing.T) {
	calls := NewCalls(CallOptions{})
	for i := range DefaultBurst {
		_, cancel, err := calls.Start(context.Background())
		if err != nil {
			t.Fatalf("call %d within the default burst: %v", i+1, err)
		}
		cancel()
	}
	if _, _, err := calls.Start(context.Background()); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("call over the default burst: %v, want ErrRateLimited", err)
	}
}

// Zero options take the defaults, the check's own cache time to live among
// them; set ones are kept.
func TestOptionsSetDefaults(t *testing.T) {
	var zero Options
	zero.SetDefaults(time.Minute)
	if zero.Rate != DefaultRate || zero.Burst != DefaultBurst || zero.CacheTTL != time.Minute || zero.Timeout != DefaultTimeout || zero.Clock == nil || zero.Logger == nil {
		t.Errorf("defaults: %+v", zero)
	}
	set := Options{Rate: 1, Burst: 2, CacheTTL: time.Second, Timeout: 3 * time.Second}
	set.SetDefaults(time.Minute)
	if set.Rate != 1 || set.Burst != 2 || set.CacheTTL != time.Second || set.Timeout != 3*time.Second {
		t.Errorf("set options changed: %+v", set)
	}
	c := &clock{now: time.Unix(1000, 0)}
	errMine := errors.New("my check's limit")
	calls := (&Options{Rate: 1, Burst: 1, Clock: c.Now}).Calls(errMine)
	_, cancel, err := calls.Start(t.Context())
	if err != nil {
		t.Fatalf("first call: %v", err)
	}
	cancel()
	if _, _, err := calls.Start(t.Context()); !errors.Is(err, errMine) {
		t.Errorf("call over the budget: %v, want the check's error", err)
	}
}
