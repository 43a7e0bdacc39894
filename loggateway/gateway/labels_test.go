package gateway

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/clock"
)

func TestParseAndStampLabels(t *testing.T) {
	node := "0190f5e4-0000-7000-8000-000000000001"
	cases := []struct {
		in, want string
	}{
		{`{}`, `{node_id="` + node + `"}`},
		{`{job="a"}`, `{job="a", node_id="` + node + `"}`},
		{` { z = "1" ,a="2", } `, `{a="2", node_id="` + node + `", z="1"}`},
		{`{node_id="other",job="a"}`, `{job="a", node_id="` + node + `"}`},
		{`{node_id="x", node_id="y"}`, `{node_id="` + node + `"}`},
		{`{job="a", job="b"}`, `{job="b", node_id="` + node + `"}`},
		{`{msg="say \"hi\"\n"}`, `{msg="say \"hi\"\n", node_id="` + node + `"}`},
		{`{_x1="é"}`, `{_x1="é", node_id="` + node + `"}`},
	}
	for _, c := range cases {
		labels, err := ParseLabels(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if got := StampNode(labels, node); got != c.want {
			t.Errorf("%s: got %s, want %s", c.in, got, c.want)
		}
	}
	for _, bad := range []string{
		``, `job="a"`, `{job=a}`, `{job="a"`, `{1job="a"}`, `{job="a" x="b"}`, `{job='a'}`, "{job=`a`}",
		`{job="a\q"}`, `{="a"}`, `{job:"a"}`, "{" + strings.Repeat(`a="b",`, maxLabels+1) + "}",
		`{a="` + strings.Repeat("v", maxLabelValueLen+1) + `"}`,
	} {
		if _, err := ParseLabels(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestAuthCacheBoundedAndShared(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	var calls atomic.Int64
	release := make(chan struct{})
	node := uuid.Must(uuid.NewV7())
	c := newAuthCache(IntrospectorFunc(func(_ context.Context, tok string) (uuid.UUID, error) {
		calls.Add(1)
		if tok == "slow" {
			<-release
		}
		if strings.HasPrefix(tok, "bad") {
			return uuid.Nil, ErrUnauthenticated
		}
		return node, nil
	}), clk, 30*time.Second, 5*time.Second, 3)

	// Concurrent misses of one token share one introspection.
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, err := c.Introspect(context.Background(), "slow"); err != nil || got != node {
				t.Errorf("shared call: %v %v", got, err)
			}
		}()
	}
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // let the others join the call in flight
	close(release)
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Errorf("10 concurrent misses made %d calls", n)
	}

	// The cache never holds more than its size.
	for _, tok := range []string{"a", "b", "bad-c", "d", "bad-e", "f"} {
		_, _ = c.Introspect(context.Background(), tok)
		if n := c.len(); n > 3 {
			t.Fatalf("cache holds %d entries, bound 3", n)
		}
	}
}
