package observability_test

import (
	"slices"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
)

func TestRoutingFollowsAlertmanagerSemantics(t *testing.T) {
	r, err := observability.ParseRouting([]byte(`
route:
  receiver: unrouted
  routes:
    - matchers: ['alertname="GantryAlertDrill"', 'owner_team="platform"']
      receiver: drill
    - match: {owner_team: platform, severity: critical}
      receiver: pager
      continue: true
    - matchers: ['owner_team=~"plat.*"']
      receiver: oncall
      routes:
        - matchers: ['domain!="billing"', 'service!~"gantry-.*"']
          receiver: obs
receivers:
  - name: unrouted
  - name: drill
    webhook_configs: [{url: "http://x"}]
  - name: pager
    webhook_configs: [{url: "http://x"}]
  - name: oncall
    email_configs: [{to: "a@b"}]
  - name: obs
    webhook_configs: []
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		labels map[string]string
		want   []string
	}{
		{map[string]string{"alertname": "GantryAlertDrill", "owner_team": "platform"}, []string{"drill"}},
		{map[string]string{"owner_team": "platform", "severity": "critical", "service": "gantry-controlplane"}, []string{"pager", "oncall"}},
		{map[string]string{"owner_team": "platformx", "service": "prometheus"}, []string{"obs"}},
		{map[string]string{"owner_team": "platform", "service": "gantry-x"}, []string{"oncall"}},
		{map[string]string{"owner_team": "xplatform"}, []string{"unrouted"}}, // anchored regex
		{map[string]string{}, []string{"unrouted"}},
	} {
		if got := r.Root.Receivers(c.labels); !slices.Equal(got, c.want) {
			t.Errorf("%v: receivers %v, want %v", c.labels, got, c.want)
		}
	}
	for name, want := range map[string]bool{"unrouted": false, "drill": true, "pager": true, "oncall": true, "obs": false} {
		if r.Delivering[name] != want {
			t.Errorf("receiver %s delivering = %v, want %v", name, r.Delivering[name], want)
		}
	}
	for _, bad := range []string{`route: {}`, `route: {receiver: a, matchers: ['x']}`, `route: {receiver: a, matchers: ['x=~"("']}`} {
		if _, err := observability.ParseRouting([]byte(bad)); err == nil {
			t.Errorf("ParseRouting(%s) accepted it", bad)
		}
	}
}
