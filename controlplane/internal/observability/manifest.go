package observability

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Rule is one alerting rule of deploy/prometheus/*.rules.yml: the alert rule manifest
// (seed 4.2.2 source alert_rule_manifest). The expression stays here: it is never
// part of a response.
type Rule struct {
	Name        string
	Group       string
	File        string
	Expr        string
	For         string
	Labels      map[string]string
	Annotations map[string]string
}

// SLO is one objective of deploy/prometheus/slos.yml.
type SLO struct {
	ID             string   `yaml:"slo_id"`
	Service        string   `yaml:"service"`
	OwnerTeam      string   `yaml:"owner_team"`
	Description    string   `yaml:"description"`
	Target         float64  `yaml:"target"`
	Unit           string   `yaml:"unit"`
	Window         string   `yaml:"window"`
	RequiredAlerts []string `yaml:"required_alerts"`
}

// Runbook is one deploy/runbooks/<id>.md: its front matter and Markdown body.
type Runbook struct {
	ID           string   `yaml:"id"`
	Title        string   `yaml:"title"`
	Severity     string   `yaml:"severity"`
	OwnerTeam    string   `yaml:"owner_team"`
	Service      string   `yaml:"service"`
	Domain       string   `yaml:"domain"`
	Summary      string   `yaml:"summary"`
	Alerts       []string `yaml:"alerts"`
	Signals      []string `yaml:"signals"`
	LastReviewed string   `yaml:"last_reviewed"`
	Body         string   `yaml:"-"`
}

// Manifest is everything the repository declares about monitoring, read once from
// the embedded deploy files.
type Manifest struct {
	Alerts   []Rule // sorted by name
	SLOs     []SLO  // in file order
	Runbooks []Runbook
	// Routing is the Alertmanager route tree of deploy/alertmanager, used when the
	// running Alertmanager cannot be asked for its own.
	Routing *Routing

	runbooks map[string]int
	alerts   map[string]int
}

// Runbook returns the runbook with id.
func (m *Manifest) Runbook(id string) (Runbook, bool) {
	i, ok := m.runbooks[id]
	if !ok {
		return Runbook{}, false
	}
	return m.Runbooks[i], true
}

// Alert returns the alerting rule named name.
func (m *Manifest) Alert(name string) (Rule, bool) {
	i, ok := m.alerts[name]
	if !ok {
		return Rule{}, false
	}
	return m.Alerts[i], true
}

var (
	runbookIDPattern = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$`)
	runbookSeverity  = map[string]bool{"critical": true, "warning": true, "info": true}
)

// LoadManifest reads the deploy files of fsys (deploy.Monitoring): prometheus/*.rules.yml,
// prometheus/slos.yml, alertmanager/alertmanager.yml and runbooks/*.md. Every problem
// a deploy file can have is an error here, so a broken file fails the build's tests
// rather than a read model at 3 am.
func LoadManifest(fsys fs.FS) (*Manifest, error) {
	m := &Manifest{runbooks: map[string]int{}, alerts: map[string]int{}}
	if err := m.loadRules(fsys); err != nil {
		return nil, err
	}
	if err := m.loadSLOs(fsys); err != nil {
		return nil, err
	}
	if err := m.loadRunbooks(fsys); err != nil {
		return nil, err
	}
	raw, err := fs.ReadFile(fsys, "alertmanager/alertmanager.yml")
	if err != nil {
		return nil, err
	}
	if m.Routing, err = ParseRouting(raw); err != nil {
		return nil, fmt.Errorf("alertmanager/alertmanager.yml: %w", err)
	}
	return m, nil
}

func (m *Manifest) loadRules(fsys fs.FS) error {
	files, err := fs.Glob(fsys, "prometheus/*.rules.yml")
	if err != nil {
		return err
	}
	for _, f := range files {
		raw, err := fs.ReadFile(fsys, f)
		if err != nil {
			return err
		}
		var doc struct {
			Groups []struct {
				Name  string `yaml:"name"`
				Rules []struct {
					Alert       string            `yaml:"alert"`
					Record      string            `yaml:"record"`
					Expr        string            `yaml:"expr"`
					For         string            `yaml:"for"`
					Labels      map[string]string `yaml:"labels"`
					Annotations map[string]string `yaml:"annotations"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		}
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for _, g := range doc.Groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					continue
				}
				if _, dup := m.alerts[r.Alert]; dup {
					return fmt.Errorf("%s: alert %s declared twice", f, r.Alert)
				}
				m.alerts[r.Alert] = len(m.Alerts)
				m.Alerts = append(m.Alerts, Rule{Name: r.Alert, Group: g.Name, File: path.Base(f),
					Expr: r.Expr, For: r.For, Labels: r.Labels, Annotations: r.Annotations})
			}
		}
	}
	sort.Slice(m.Alerts, func(i, j int) bool { return m.Alerts[i].Name < m.Alerts[j].Name })
	for i, a := range m.Alerts {
		m.alerts[a.Name] = i
	}
	return nil
}

func (m *Manifest) loadSLOs(fsys fs.FS) error {
	raw, err := fs.ReadFile(fsys, "prometheus/slos.yml")
	if err != nil {
		return err
	}
	var doc struct {
		SLOs []SLO `yaml:"slos"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("prometheus/slos.yml: %w", err)
	}
	seen := map[string]bool{}
	for _, s := range doc.SLOs {
		switch {
		case s.ID == "" || seen[s.ID]:
			return fmt.Errorf("prometheus/slos.yml: slo_id %q empty or repeated", s.ID)
		case s.Target <= 0 || s.Target >= 1:
			return fmt.Errorf("prometheus/slos.yml: %s: target %v outside (0,1)", s.ID, s.Target)
		case len(s.RequiredAlerts) == 0:
			return fmt.Errorf("prometheus/slos.yml: %s: no required_alerts", s.ID)
		}
		if _, err := parseWindow(s.Window); err != nil {
			return fmt.Errorf("prometheus/slos.yml: %s: %w", s.ID, err)
		}
		seen[s.ID] = true
	}
	m.SLOs = doc.SLOs
	return nil
}

func (m *Manifest) loadRunbooks(fsys fs.FS) error {
	files, err := fs.Glob(fsys, "runbooks/*.md")
	if err != nil {
		return err
	}
	for _, f := range files {
		if path.Base(f) == "README.md" {
			continue
		}
		raw, err := fs.ReadFile(fsys, f)
		if err != nil {
			return err
		}
		rb, err := parseRunbook(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if rb.ID+".md" != path.Base(f) {
			return fmt.Errorf("%s: id %q does not match the file name", f, rb.ID)
		}
		m.runbooks[rb.ID] = len(m.Runbooks)
		m.Runbooks = append(m.Runbooks, rb)
	}
	return nil
}

// parseRunbook splits the front matter (between the first two "---" lines) from the
// Markdown body and checks the required fields.
func parseRunbook(raw []byte) (Runbook, error) {
	text := strings.ReplaceAll(string(raw), "\r\n", "\n")
	if !strings.HasPrefix(text, "---\n") {
		return Runbook{}, fmt.Errorf("no front matter (the file must start with ---)")
	}
	front, body, ok := strings.Cut(text[4:], "\n---\n")
	if !ok {
		return Runbook{}, fmt.Errorf("front matter not closed by ---")
	}
	var rb Runbook
	dec := yaml.NewDecoder(strings.NewReader(front))
	dec.KnownFields(true)
	if err := dec.Decode(&rb); err != nil {
		return Runbook{}, fmt.Errorf("front matter: %w", err)
	}
	switch {
	case !runbookIDPattern.MatchString(rb.ID):
		return Runbook{}, fmt.Errorf("id %q is not of the form area.condition", rb.ID)
	case rb.Title == "" || rb.OwnerTeam == "" || rb.Service == "" || rb.Domain == "" || rb.Summary == "" || rb.LastReviewed == "":
		return Runbook{}, fmt.Errorf("front matter needs title, owner_team, service, domain, summary and last_reviewed")
	case !runbookSeverity[rb.Severity]:
		return Runbook{}, fmt.Errorf("severity %q is not critical, warning or info", rb.Severity)
	}
	if _, err := time.Parse(time.DateOnly, rb.LastReviewed); err != nil {
		return Runbook{}, fmt.Errorf("last_reviewed %q is not a date (YYYY-MM-DD)", rb.LastReviewed)
	}
	rb.Body = strings.TrimLeft(body, "\n")
	return rb, nil
}

// alertSeverities are the severities an alert rule may carry (seed 4.2.1's enum less
// `unknown`, which is what an alert without one is reported as).
var alertSeverities = map[string]bool{"sev1": true, "sev2": true, "sev3": true, "warning": true, "critical": true}

// Check returns every inconsistency between the deploy files: an alert without the
// labels the read models and routing need, an alert whose runbook_id names no runbook,
// a runbook listing an alert that does not point back, an SLO requiring an unknown
// alert, an alert that the routing tree leaves undelivered.
func (m *Manifest) Check() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, a := range m.Alerts {
		for _, l := range []string{"severity", "owner_team", "service", "domain", "runbook_id"} {
			if a.Labels[l] == "" {
				bad("alert %s (%s): no %s label", a.Name, a.File, l)
			}
		}
		if !alertSeverities[a.Labels["severity"]] {
			bad("alert %s: severity %q is not one of sev1, sev2, sev3, warning, critical", a.Name, a.Labels["severity"])
		}
		id := a.Labels["runbook_id"]
		if _, ok := m.Runbook(id); !ok {
			bad("alert %s: runbook_id %q names no deploy/runbooks/%s.md", a.Name, id, id)
		}
		if an := a.Annotations["runbook_id"]; an != id {
			bad("alert %s: annotation runbook_id %q differs from the label %q", a.Name, an, id)
		}
		if a.Annotations["summary"] == "" {
			bad("alert %s: no summary annotation", a.Name)
		}
		if m.Routing != nil && !m.routed(a.Labels, a.Name) {
			bad("alert %s: the Alertmanager routes deliver it nowhere (%v)", a.Name, m.Routing.Root.Receivers(withName(a.Labels, a.Name)))
		}
	}
	for _, rb := range m.Runbooks {
		for _, name := range rb.Alerts {
			a, ok := m.Alert(name)
			switch {
			case !ok:
				bad("runbook %s lists alert %s, which no rule declares", rb.ID, name)
			case a.Labels["runbook_id"] != rb.ID:
				bad("runbook %s lists alert %s, whose runbook_id is %s", rb.ID, name, a.Labels["runbook_id"])
			}
		}
	}
	for _, s := range m.SLOs {
		for _, name := range s.RequiredAlerts {
			if _, ok := m.Alert(name); !ok {
				bad("slo %s requires alert %s, which no rule declares", s.ID, name)
			}
		}
	}
	return errs
}

func withName(labels map[string]string, name string) map[string]string {
	out := make(map[string]string, len(labels)+1)
	for k, v := range labels {
		out[k] = v
	}
	out["alertname"] = name
	return out
}

// routed reports whether the manifest's own routing delivers an alert somewhere.
func (m *Manifest) routed(labels map[string]string, name string) bool {
	for _, r := range m.Routing.Root.Receivers(withName(labels, name)) {
		if m.Routing.Delivering[r] {
			return true
		}
	}
	return false
}
