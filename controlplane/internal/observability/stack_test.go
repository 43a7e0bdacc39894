package observability_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gantry-gpu/gantry/deploy"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

// stack is a real Prometheus and Alertmanager started for one test, loading the
// repository's rules and routes, scraping metrics the test controls.
type stack struct {
	PromURL, AMURL string
	// CP is the registry served as the gantry-controlplane job's /metrics.
	CP *prometheus.Registry
	// ReceiverURL is the webhook the Alertmanager routes deliver to (it stands in for the
	// control plane's receiver and must never appear in a read model answer), and
	// ReceiverToken the bearer it is sent with.
	ReceiverURL, ReceiverToken string

	mu       sync.Mutex
	received []map[string]any
}

// Received returns the webhook payloads delivered so far.
func (s *stack) Received() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.received...)
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// binary finds the first of names on PATH, or skips (fails under CI=true).
func binary(t *testing.T, pkg string, names ...string) string {
	t.Helper()
	var err error
	for _, n := range names {
		var p string
		if p, err = exec.LookPath(n); err == nil {
			return p
		}
	}
	ci.SkipUnlessAvailable(t, names[0]+" (apt-get install "+pkg+")", err)
	return ""
}

// startStack starts Prometheus (evaluating every rules file of deploy/prometheus but
// the ones in skipRules, every second) and Alertmanager (deploy/alertmanager's routes,
// receivers pointed at a webhook of the test).
func startStack(t *testing.T, skipRules ...string) *stack {
	t.Helper()
	return startStackWith(t, stackOptions{skipRules: skipRules})
}

// stackOptions: receiverURL and receiverTokenFile replace the test's own webhook (a
// control plane's receiver instead); amAddr and promAddr are the listen addresses when
// the caller needed to know them first.
type stackOptions struct {
	skipRules                      []string
	receiverURL, receiverTokenFile string
	amAddr, promAddr               string
}

func startStackWith(t *testing.T, o stackOptions) *stack {
	t.Helper()
	skipRules := o.skipRules
	promBin := binary(t, "prometheus", "prometheus")
	amBin := binary(t, "prometheus-alertmanager", "prometheus-alertmanager", "alertmanager")
	dir := t.TempDir()
	s := &stack{CP: prometheus.NewRegistry(), ReceiverToken: "drill-receiver-secret-" + fmt.Sprint(time.Now().UnixNano())}

	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		if r.Header.Get("Authorization") == "Bearer "+s.ReceiverToken {
			s.mu.Lock()
			s.received = append(s.received, body)
			s.mu.Unlock()
		}
	}))
	t.Cleanup(receiver.Close)
	s.ReceiverURL = receiver.URL + "/api/v1/internal/alerts/receiver"

	targets := http.NewServeMux()
	targets.Handle("/metrics", promhttp.HandlerFor(s.CP, promhttp.HandlerOpts{}))
	targets.HandleFunc("/loggateway-metrics", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable) // the log gateway is down
	})
	target := httptest.NewServer(targets)
	t.Cleanup(target.Close)

	// Alertmanager: the repository's routes, with the receivers' address and token file
	// replaced by the test's.
	amAddr := o.amAddr
	if amAddr == "" {
		amAddr = freePort(t)
	}
	tokenFile := filepath.Join(dir, "receiver.token")
	must(t, os.WriteFile(tokenFile, []byte(s.ReceiverToken), 0o600))
	if o.receiverURL != "" {
		s.ReceiverURL, tokenFile = o.receiverURL, o.receiverTokenFile
	}
	amCfg, err := deploy.Monitoring.ReadFile("alertmanager/alertmanager.yml")
	must(t, err)
	amCfg = bytes.ReplaceAll(amCfg, []byte("http://127.0.0.1:8080/api/v1/internal/alerts/receiver"), []byte(s.ReceiverURL))
	amCfg = bytes.ReplaceAll(amCfg, []byte("/etc/gantry/alert-receiver.token"), []byte(tokenFile))
	// A test cannot wait the production group_wait: deliveries within a second.
	amCfg = bytes.Replace(amCfg, []byte("group_wait: 30s"), []byte("group_wait: 1s"), 1)
	must(t, os.WriteFile(filepath.Join(dir, "alertmanager.yml"), amCfg, 0o600))
	start(t, amBin, "--config.file="+filepath.Join(dir, "alertmanager.yml"), "--storage.path="+filepath.Join(dir, "am"),
		"--web.listen-address="+amAddr, "--cluster.listen-address=")
	s.AMURL = "http://" + amAddr

	// Prometheus: the repository's rules, evaluated and scraped every second.
	promAddr := o.promAddr
	if promAddr == "" {
		promAddr = freePort(t)
	}
	files, err := filepath.Glob(filepath.Join(deployDir, "prometheus", "*.rules.yml"))
	must(t, err)
	var rules []string
	for _, f := range files {
		skip := false
		for _, sk := range skipRules {
			skip = skip || filepath.Base(f) == sk
		}
		if !skip {
			abs, _ := filepath.Abs(f)
			rules = append(rules, fmt.Sprintf("%q", abs))
		}
	}
	host := strings.TrimPrefix(target.URL, "http://")
	promCfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%s]
alerting: {alertmanagers: [{static_configs: [{targets: ["%s"]}]}]}
scrape_configs:
  - {job_name: gantry-controlplane, static_configs: [{targets: ["%s"]}]}
  - {job_name: gantry-loggateway, metrics_path: /loggateway-metrics, static_configs: [{targets: ["%s"]}]}
`, strings.Join(rules, ", "), amAddr, host, host)
	must(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(promCfg), 0o600))
	start(t, promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "prom"),
		"--web.listen-address="+promAddr)
	s.PromURL = "http://" + promAddr

	waitFor(t, 60*time.Second, "prometheus and alertmanager ready", func() bool {
		return ready(s.PromURL+"/-/ready") && ready(s.AMURL+"/-/ready")
	})
	return s
}

func start(t *testing.T, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	must(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), tail(out.String(), 3000))
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func ready(u string) bool {
	res, err := http.Get(u)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// waitFor polls cond until it holds; the deadline only bounds a broken run (no timing
// is asserted).
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// silence silences alertname in the stack's Alertmanager for an hour.
func (s *stack) silence(t *testing.T, alertname string) {
	t.Helper()
	now := time.Now().UTC()
	body, _ := json.Marshal(map[string]any{
		"matchers": []map[string]any{{"name": "alertname", "value": alertname, "isRegex": false, "isEqual": true}},
		"startsAt": now.Format(time.RFC3339), "endsAt": now.Add(time.Hour).Format(time.RFC3339),
		"createdBy": "observability test", "comment": "suppressed on purpose",
	})
	res, err := http.Post(s.AMURL+"/api/v2/silences", "application/json", bytes.NewReader(body))
	must(t, err)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("create silence: %d", res.StatusCode)
	}
}

var _ = context.Background
