package provisioning_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/provisioning"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

const rulesDir = "../../../deploy/prometheus"

// The alert rules pass `promtool check rules` and their unit tests (deploy/prometheus/
// check.sh), every alert carries runbook_id ops.provisioning.stuck as a label and an
// annotation, and every provisioning metric they read is one this package exports.
func TestAlertRules(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join(rulesDir, "gantry-provisioning.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := strings.Count(string(rules), "- alert: ")
	if alerts < 3 || strings.Count(string(rules), "runbook_id: ops.provisioning.stuck") != 2*alerts {
		t.Fatalf("%d alerts; each needs runbook_id ops.provisioning.stuck as a label and an annotation", alerts)
	}
	reg := prometheus.NewRegistry()
	if _, err := provisioning.NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{"provisioning_dispatch_latency_seconds_count": true}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	exported["nats_consumer_lag"] = true // a vector: gathered once it has a stream
	for _, name := range regexp.MustCompile(`\b(provisioning_[a-z_]+|nats_consumer_lag)\b`).FindAllString(string(rules), -1) {
		if !exported[name] {
			t.Errorf("the rules read %s, which the dispatcher does not export", name)
		}
	}

	_, err = exec.LookPath("promtool")
	ci.SkipUnlessAvailable(t, "promtool (apt-get install prometheus)", err)
	out, err := exec.Command(filepath.Join(rulesDir, "check.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("deploy/prometheus/check.sh: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), fmt.Sprintf("SUCCESS: %d rules found", alerts)) {
		t.Fatalf("promtool output:\n%s", out)
	}
}
