package provisioning

import (
	"testing"
	"time"
)

func TestBackoffDoublesJittersAndCaps(t *testing.T) {
	const minD, maxD = time.Second, 30 * time.Second
	cases := []struct {
		attempt int
		lo, hi  time.Duration // rnd 0 and rnd → 1
	}{
		{1, 500 * time.Millisecond, time.Second},
		{2, time.Second, 2 * time.Second},
		{3, 2 * time.Second, 4 * time.Second},
		{5, 8 * time.Second, 16 * time.Second},
		{6, 15 * time.Second, 30 * time.Second},
		{7, 15 * time.Second, 30 * time.Second},
		{1000, 15 * time.Second, 30 * time.Second},
	}
	for _, c := range cases {
		if got := backoff(c.attempt, minD, maxD, 0); got != c.lo {
			t.Errorf("attempt %d, rnd 0: %s, want %s", c.attempt, got, c.lo)
		}
		if got := backoff(c.attempt, minD, maxD, 0.999999999); got < c.hi-time.Millisecond || got > c.hi {
			t.Errorf("attempt %d, rnd ~1: %s, want ~%s", c.attempt, got, c.hi)
		}
	}
}

func TestRetryDelayNeverPassesTheDeadline(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := retryDelay(6, time.Second, 30*time.Second, 0.5, now, now.Add(time.Hour)); got != 22500*time.Millisecond {
		t.Fatalf("far deadline: %s", got)
	}
	if got := retryDelay(6, time.Second, 30*time.Second, 0.5, now, now.Add(3*time.Second)); got != 3*time.Second {
		t.Fatalf("near deadline: %s", got)
	}
	// At (or past) the deadline the message comes back at once, to be failed.
	if got := retryDelay(6, time.Second, 30*time.Second, 0.5, now, now); got != 10*time.Millisecond {
		t.Fatalf("at the deadline: %s", got)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{AttemptTimeout: 45 * time.Second, SubjectPrefix: "x.prov"}.withDefaults()
	if c.Stream != "PROVISIONING" || c.SubjectPrefix != "x.prov." || c.Consumer != DefaultConsumer ||
		c.AckWait != 90*time.Second || c.MaxAckPending != DefaultMaxAckPending || c.BackoffMin != time.Second || c.BackoffMax != 30*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if s := (Config{}).Subject(); s != "gantry.provisioning.dispatch" {
		t.Fatalf("subject %s", s)
	}
	if r := (Config{SubjectPrefix: "test.ab.provisioning."}).Route(); r.From != "gantry.provisioning." || r.To != "test.ab.provisioning." {
		t.Fatalf("route %+v", r)
	}
	cc := consumerConfig(c)
	if cc.Durable != DefaultConsumer || cc.FilterSubject != "x.prov.dispatch" || cc.MaxDeliver != -1 || cc.AckWait != c.AckWait || cc.MaxAckPending != c.MaxAckPending {
		t.Fatalf("consumer %+v", cc)
	}
}
