package devenv_test

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/devenv"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// make dev's monitoring: the configuration written from deploy/ passes promtool and
// amtool, scrapes the addresses it was given, and the two programs start with it and
// Prometheus loads every rule.
func TestPrepareMonitoring(t *testing.T) {
	for _, tool := range []string{"promtool", "amtool"} {
		_, err := exec.LookPath(tool)
		ci.SkipUnlessAvailable(t, tool+" ("+devenv.InstallMonitoringHint+")", err)
	}
	dir := t.TempDir()
	o := devenv.MonitoringOptions{Dir: dir, ControlPlaneAddr: "127.0.0.1:18080", ControlPlaneURL: "http://127.0.0.1:18080",
		GatewayAddr: "127.0.0.1:13100", PrometheusAddr: freeAddr(t), AlertmanagerAddr: freeAddr(t)}
	m, err := devenv.PrepareMonitoring(o)
	if err != nil {
		ci.SkipUnlessAvailable(t, "prometheus and alertmanager ("+devenv.InstallMonitoringHint+")", err)
	}
	promCfg := dir + "/monitoring/prometheus.yml"
	if out, err := exec.Command("promtool", "check", "config", promCfg).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	if out, err := exec.Command("amtool", "check-config", dir+"/monitoring/alertmanager.yml").CombinedOutput(); err != nil {
		t.Fatalf("amtool check-config: %v\n%s", err, out)
	}
	raw, _ := os.ReadFile(promCfg)
	am, _ := os.ReadFile(dir + "/monitoring/alertmanager.yml")
	for _, want := range []string{`"127.0.0.1:18080"`, `"127.0.0.1:13100"`, `"` + o.AlertmanagerAddr + `"`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("prometheus.yml lacks %s", want)
		}
	}
	if !strings.Contains(string(am), "http://127.0.0.1:18080/api/v1/internal/alerts/receiver") || !strings.Contains(string(am), m.ReceiverTokenFile) {
		t.Errorf("alertmanager.yml does not deliver to the control plane with the token file:\n%s", am)
	}
	for _, f := range []string{m.ReceiverTokenFile, m.NodeMetricsTokenFile} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() < 20 {
			t.Errorf("token file %s: %v %v", f, fi, err)
		}
	}
	// Node agents are discovered and scraped through the control plane with their own token.
	if !strings.Contains(string(raw), "url: http://127.0.0.1:18080/api/v1/internal/metrics/nodes") || strings.Count(string(raw), m.NodeMetricsTokenFile) != 2 {
		t.Errorf("prometheus.yml does not discover node agents through the control plane with the node metrics token:\n%s", raw)
	}

	for _, argv := range [][]string{m.Prometheus, m.Alertmanager} {
		cmd := exec.Command(argv[0], argv[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		r1, e1 := http.Get(m.PrometheusURL + "/-/ready")
		r2, e2 := http.Get(m.AlertmanagerURL + "/-/ready")
		if e1 == nil && e2 == nil && r1.StatusCode == 200 && r2.StatusCode == 200 {
			r1.Body.Close()
			r2.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev prometheus/alertmanager not ready: %v %v", e1, e2)
		}
		time.Sleep(200 * time.Millisecond)
	}
	res, err := http.Get(m.PrometheusURL + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(res.Body)
	for _, alert := range []string{"ProvisioningQueueStuck", "ApiAvailabilityBudgetBurn", "GantryComponentDown"} {
		if !strings.Contains(body.String(), `"name":"`+alert+`"`) {
			t.Errorf("the dev Prometheus did not load %s", alert)
		}
	}
}
