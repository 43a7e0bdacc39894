package devenv

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/deploy"
)

// Default addresses of the dev Prometheus and Alertmanager: the ones deploy/prometheus
// and deploy/alertmanager name.
const (
	DevPrometheusAddr   = "127.0.0.1:9090"
	DevAlertmanagerAddr = "127.0.0.1:9093"
)

// InstallMonitoringHint is printed when the Debian packages are missing.
const InstallMonitoringHint = "apt-get install prometheus prometheus-alertmanager"

// Monitoring is a Prometheus and an Alertmanager ready to start for make dev: their
// binaries, arguments and configuration (written under <dir>/monitoring from the
// repository's deploy files, pointed at this machine's control plane and log gateway).
type Monitoring struct {
	Prometheus, Alertmanager       []string // binary and arguments
	PrometheusURL, AlertmanagerURL string
	// ReceiverTokenFile holds the bearer Alertmanager sends to the control plane's alert
	// receiver (GANTRY_ALERT_RECEIVER_TOKEN_FILE).
	ReceiverTokenFile string
	// NodeMetricsTokenFile holds the bearer Prometheus sends to discover and scrape the
	// node agents through the control plane (GANTRY_NODE_METRICS_TOKEN_FILE).
	NodeMetricsTokenFile string
}

// ErrMonitoringNotInstalled means the Prometheus or Alertmanager binary is missing.
var ErrMonitoringNotInstalled = errors.New("prometheus or alertmanager not installed (" + InstallMonitoringHint + ")")

// lookMonitoring finds the binaries; PATH is searched for the Debian names first.
func lookMonitoring() (prom, am string, err error) {
	if prom, err = exec.LookPath("prometheus"); err != nil {
		return "", "", ErrMonitoringNotInstalled
	}
	for _, n := range []string{"prometheus-alertmanager", "alertmanager"} {
		if am, err = exec.LookPath(n); err == nil {
			return prom, am, nil
		}
	}
	return "", "", ErrMonitoringNotInstalled
}

// MonitoringOptions say where the dev monitoring scrapes and listens.
type MonitoringOptions struct {
	Dir                               string
	ControlPlaneAddr, ControlPlaneURL string
	GatewayAddr                       string
	PrometheusAddr, AlertmanagerAddr  string // DevPrometheusAddr, DevAlertmanagerAddr when empty
}

// PrepareMonitoring writes the dev monitoring configuration under dir/monitoring:
// deploy/prometheus's config and rules scraping the control plane and the log gateway,
// and deploy/alertmanager's routes delivering to the control plane's alert receiver. It
// returns ErrMonitoringNotInstalled when the binaries are missing, and an error naming
// the address when a listen address is taken (another Prometheus already runs).
func PrepareMonitoring(o MonitoringOptions) (*Monitoring, error) {
	promBin, amBin, err := lookMonitoring()
	if err != nil {
		return nil, err
	}
	if o.PrometheusAddr == "" {
		o.PrometheusAddr = DevPrometheusAddr
	}
	if o.AlertmanagerAddr == "" {
		o.AlertmanagerAddr = DevAlertmanagerAddr
	}
	for _, addr := range []string{o.PrometheusAddr, o.AlertmanagerAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("%s is taken (another Prometheus or Alertmanager runs?): %w", addr, err)
		}
		ln.Close()
	}
	mdir, err := filepath.Abs(filepath.Join(o.Dir, "monitoring"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(mdir, "rules"), 0o755); err != nil {
		return nil, err
	}
	rules, err := fs.Glob(deploy.Monitoring, "prometheus/*.rules.yml")
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		raw, err := deploy.Monitoring.ReadFile(r)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(mdir, "rules", filepath.Base(r)), raw, 0o644); err != nil {
			return nil, err
		}
	}
	prom, err := deploy.Monitoring.ReadFile("prometheus/prometheus.yml")
	if err != nil {
		return nil, err
	}
	prom = bytes.ReplaceAll(prom, []byte(`"127.0.0.1:8080"`), []byte(`"`+o.ControlPlaneAddr+`"`))
	prom = bytes.ReplaceAll(prom, []byte("http://127.0.0.1:8080"), []byte(strings.TrimRight(o.ControlPlaneURL, "/")))
	nodeTokenFile := filepath.Join(mdir, "node-metrics.token")
	if err := writeTokenOnce(nodeTokenFile); err != nil {
		return nil, err
	}
	prom = bytes.ReplaceAll(prom, []byte("/etc/gantry/node-metrics.token"), []byte(nodeTokenFile))
	prom = bytes.ReplaceAll(prom, []byte(`"127.0.0.1:3100"`), []byte(`"`+o.GatewayAddr+`"`))
	prom = bytes.ReplaceAll(prom, []byte(`"127.0.0.1:9090"`), []byte(`"`+o.PrometheusAddr+`"`))
	prom = bytes.ReplaceAll(prom, []byte(`"127.0.0.1:9093"`), []byte(`"`+o.AlertmanagerAddr+`"`))
	prom = bytes.ReplaceAll(prom, []byte("  - gantry-*.rules.yml"), []byte("  - "+filepath.Join(mdir, "rules", "*.rules.yml")))
	if err := os.WriteFile(filepath.Join(mdir, "prometheus.yml"), prom, 0o644); err != nil {
		return nil, err
	}

	tokenFile := filepath.Join(mdir, "alert-receiver.token")
	if err := writeTokenOnce(tokenFile); err != nil {
		return nil, err
	}
	am, err := deploy.Monitoring.ReadFile("alertmanager/alertmanager.yml")
	if err != nil {
		return nil, err
	}
	am = bytes.ReplaceAll(am, []byte("http://127.0.0.1:8080"), []byte(strings.TrimRight(o.ControlPlaneURL, "/")))
	am = bytes.ReplaceAll(am, []byte("/etc/gantry/alert-receiver.token"), []byte(tokenFile))
	if err := os.WriteFile(filepath.Join(mdir, "alertmanager.yml"), am, 0o644); err != nil {
		return nil, err
	}
	return &Monitoring{
		Prometheus: []string{promBin, "--config.file=" + filepath.Join(mdir, "prometheus.yml"),
			"--storage.tsdb.path=" + filepath.Join(mdir, "prometheus-data"), "--web.listen-address=" + o.PrometheusAddr},
		Alertmanager: []string{amBin, "--config.file=" + filepath.Join(mdir, "alertmanager.yml"),
			"--storage.path=" + filepath.Join(mdir, "alertmanager-data"), "--web.listen-address=" + o.AlertmanagerAddr,
			"--cluster.listen-address="},
		PrometheusURL: "http://" + o.PrometheusAddr, AlertmanagerURL: "http://" + o.AlertmanagerAddr,
		ReceiverTokenFile: tokenFile, NodeMetricsTokenFile: nodeTokenFile,
	}, nil
}

// writeTokenOnce writes a fresh secret to path unless it exists (a restarted make dev
// keeps the token the running configuration names).
func writeTokenOnce(path string) error {
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	tok, err := newClientSecret()
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(tok), 0o600)
}
