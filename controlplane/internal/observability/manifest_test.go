package observability_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"go.yaml.in/yaml/v3"

	"github.com/gantry-gpu/gantry/controlplane/internal/observability"
	"github.com/gantry-gpu/gantry/deploy"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

const deployDir = "../../../deploy"

func manifest(t *testing.T) *observability.Manifest {
	t.Helper()
	m, err := observability.LoadManifest(deploy.Monitoring)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Every alert rule names an existing runbook (label and annotation), carries the
// labels routing and the read models need, is delivered by the Alertmanager routes;
// every runbook's alerts point back; every SLO's required alerts exist.
func TestDeployManifestIsConsistent(t *testing.T) {
	m := manifest(t)
	if len(m.Alerts) < 13 || len(m.SLOs) < 4 || len(m.Runbooks) < 10 {
		t.Fatalf("manifest too small: %d alerts, %d SLOs, %d runbooks", len(m.Alerts), len(m.SLOs), len(m.Runbooks))
	}
	for _, err := range m.Check() {
		t.Error(err)
	}
	for _, want := range []string{"api-availability", "api-latency", "provisioning-time", "loggateway-acceptance"} {
		if !slices.ContainsFunc(m.SLOs, func(s observability.SLO) bool { return s.ID == want }) {
			t.Errorf("slos.yml declares no %s", want)
		}
	}
}

// The check can fail: an alert naming a runbook that does not exist, a runbook listing
// an alert that points elsewhere, and an alert the routes leave at `unrouted`.
func TestManifestCheckFindsBrokenLinks(t *testing.T) {
	fsys := fstest.MapFS{}
	for _, f := range []string{"prometheus/slos.yml", "alertmanager/alertmanager.yml", "runbooks/ops.api.latency.md"} {
		raw, err := deploy.Monitoring.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fsys[f] = &fstest.MapFile{Data: raw}
	}
	fsys["prometheus/slos.yml"] = &fstest.MapFile{Data: []byte("slos: []\n")}
	fsys["prometheus/x.rules.yml"] = &fstest.MapFile{Data: []byte(`groups:
  - name: x
    rules:
      - alert: ApiLatencyBudgetBurn
        expr: vector(1)
        labels: {severity: warning, owner_team: platform, service: s, domain: d, runbook_id: ops.api.gone}
        annotations: {summary: s, runbook_id: ops.api.gone}
      - alert: Orphan
        expr: vector(1)
        labels: {severity: page, owner_team: nobody, service: s, domain: d, runbook_id: ops.api.latency}
        annotations: {summary: s, runbook_id: ops.api.latency}
`)}
	m, err := observability.LoadManifest(fsys)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range m.Check() {
		got = append(got, e.Error())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		`alert ApiLatencyBudgetBurn: runbook_id "ops.api.gone" names no deploy/runbooks/ops.api.gone.md`,
		"runbook ops.api.latency lists alert ApiLatencyBudgetBurn, whose runbook_id is ops.api.gone",
		`alert Orphan: severity "page"`,
		"alert Orphan: the Alertmanager routes deliver it nowhere ([unrouted])",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("Check() did not report %q; got:\n%s", want, all)
		}
	}
}

// Broken runbook files are refused with the reason.
func TestRunbookFrontMatterErrors(t *testing.T) {
	for name, body := range map[string]string{
		"no front matter": "# title\n",
		"not closed":      "---\nid: ops.a.b\n",
		"unknown field":   "---\nid: ops.a.b\ntitle: t\nseverity: info\nowner_team: p\nservice: s\ndomain: d\nsummary: s\nlast_reviewed: 2026-01-01\npager: 555\n---\nbody\n",
		"bad date":        "---\nid: ops.a.b\ntitle: t\nseverity: info\nowner_team: p\nservice: s\ndomain: d\nsummary: s\nlast_reviewed: last week\n---\nbody\n",
		"bad severity":    "---\nid: ops.a.b\ntitle: t\nseverity: loud\nowner_team: p\nservice: s\ndomain: d\nsummary: s\nlast_reviewed: 2026-01-01\n---\nbody\n",
		"id not the file": "---\nid: ops.a.c\ntitle: t\nseverity: info\nowner_team: p\nservice: s\ndomain: d\nsummary: s\nlast_reviewed: 2026-01-01\n---\nbody\n",
	} {
		t.Run(name, func(t *testing.T) {
			fsys := fstest.MapFS{"runbooks/ops.a.b.md": {Data: []byte(body)}}
			for _, f := range []string{"prometheus/slos.yml", "alertmanager/alertmanager.yml"} {
				raw, _ := deploy.Monitoring.ReadFile(f)
				fsys[f] = &fstest.MapFile{Data: raw}
			}
			fsys["prometheus/slos.yml"] = &fstest.MapFile{Data: []byte("slos: []\n")}
			if _, err := observability.LoadManifest(fsys); err == nil {
				t.Fatal("LoadManifest accepted it")
			}
		})
	}
}

// promtool checks the Prometheus config and rules and runs the rule unit tests, amtool
// checks the Alertmanager config (deploy/prometheus/check.sh); and every alert rule has
// a unit test in which it fires.
func TestDeployChecksPass(t *testing.T) {
	m := manifest(t)
	tested := map[string]bool{}
	tests, err := filepath.Glob(filepath.Join(deployDir, "prometheus/tests/*.test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tests {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string `yaml:"alertname"`
					ExpAlerts []any  `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			} `yaml:"tests"`
		}
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, tg := range doc.Tests {
			for _, at := range tg.AlertRuleTest {
				if len(at.ExpAlerts) > 0 {
					tested[at.Alertname] = true
				}
			}
		}
	}
	for _, a := range m.Alerts {
		if !tested[a.Name] {
			t.Errorf("alert %s has no promtool test in which it fires", a.Name)
		}
	}

	for _, tool := range []string{"promtool (apt-get install prometheus)", "amtool (apt-get install prometheus-alertmanager)"} {
		_, err := exec.LookPath(strings.Fields(tool)[0])
		ci.SkipUnlessAvailable(t, tool, err)
	}
	out, err := exec.Command(filepath.Join(deployDir, "prometheus/check.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("deploy/prometheus/check.sh: %v\n%s", err, out)
	}
	for _, want := range []string{"is valid prometheus config file syntax", "Checking '../alertmanager/alertmanager.yml'  SUCCESS"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check.sh output lacks %q:\n%s", want, out)
		}
	}
}
