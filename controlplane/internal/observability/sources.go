package observability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"math"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// sourceTimeout bounds every call to Prometheus or Alertmanager: a read model answers
// "unknown" quickly rather than hanging with a sick monitoring stack.
const sourceTimeout = 3 * time.Second

// Prometheus is the part of Prometheus's HTTP API the read models use.
type Prometheus struct {
	api promv1.API
}

// NewPrometheus returns a client of the Prometheus at baseURL ("" = not configured: nil).
func NewPrometheus(baseURL string) (*Prometheus, error) {
	if baseURL == "" {
		return nil, nil
	}
	c, err := promapi.NewClient(promapi.Config{Address: baseURL, Client: &http.Client{Timeout: sourceTimeout}})
	if err != nil {
		return nil, fmt.Errorf("prometheus url: %w", err)
	}
	return &Prometheus{api: promv1.NewAPI(c)}, nil
}

// Rules returns the alerting rules Prometheus has loaded, by name, and the recording
// rules' names.
func (p *Prometheus) Rules(ctx context.Context) (alerting map[string]promv1.AlertingRule, recording map[string]bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, sourceTimeout)
	defer cancel()
	res, err := p.api.Rules(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	alerting, recording = map[string]promv1.AlertingRule{}, map[string]bool{}
	for _, g := range res.Groups {
		for _, r := range g.Rules {
			switch r := r.(type) {
			case promv1.AlertingRule:
				alerting[r.Name] = r
			case promv1.RecordingRule:
				recording[r.Name] = true
			}
		}
	}
	return alerting, recording, nil
}

// Targets returns the active scrape targets.
func (p *Prometheus) Targets(ctx context.Context) ([]promv1.ActiveTarget, error) {
	ctx, cancel := context.WithTimeout(ctx, sourceTimeout)
	defer cancel()
	res, err := p.api.Targets(ctx)
	if err != nil {
		return nil, err
	}
	return res.Active, nil
}

// Alertmanager is the part of Alertmanager's v2 API the read models and drills use.
// Plain JSON over HTTP: the payloads are small and stable, and the generated client
// would bring a large dependency tree for four calls.
type Alertmanager struct {
	base string
	http *http.Client
}

// NewAlertmanager returns a client of the Alertmanager at baseURL ("" = nil).
func NewAlertmanager(baseURL string) *Alertmanager {
	if baseURL == "" {
		return nil
	}
	return &Alertmanager{base: strings.TrimRight(baseURL, "/"), http: &http.Client{Timeout: sourceTimeout}}
}

// AMAlert is an alert as Alertmanager's GET /api/v2/alerts returns it.
type AMAlert struct {
	Labels   map[string]string `json:"labels"`
	StartsAt time.Time         `json:"startsAt"`
	Status   struct {
		State string `json:"state"` // active, suppressed, unprocessed
	} `json:"status"`
	Receivers []struct {
		Name string `json:"name"`
	} `json:"receivers"`
}

func (a *Alertmanager) do(ctx context.Context, method, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, sourceTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("alertmanager %s %s: status %d", method, path, res.StatusCode)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(io.LimitReader(res.Body, 8<<20)).Decode(out)
}

// Routing reads the running configuration's route tree (GET /api/v2/status).
func (a *Alertmanager) Routing(ctx context.Context) (*Routing, error) {
	var st struct {
		Config struct {
			Original string `json:"original"`
		} `json:"config"`
	}
	if err := a.do(ctx, http.MethodGet, "/api/v2/status", nil, &st); err != nil {
		return nil, err
	}
	return ParseRouting([]byte(st.Config.Original))
}

// Alerts returns the alerts Alertmanager holds, silenced and inhibited ones included.
func (a *Alertmanager) Alerts(ctx context.Context) ([]AMAlert, error) {
	var out []AMAlert
	err := a.do(ctx, http.MethodGet, "/api/v2/alerts?active=true&silenced=true&inhibited=true", nil, &out)
	return out, err
}

// Post sends alerts to Alertmanager (POST /api/v2/alerts), as Prometheus would.
func (a *Alertmanager) Post(ctx context.Context, labels, annotations map[string]string, startsAt, endsAt time.Time) error {
	return a.do(ctx, http.MethodPost, "/api/v2/alerts", []map[string]any{{
		"labels": labels, "annotations": annotations,
		"startsAt": startsAt.UTC().Format(time.RFC3339), "endsAt": endsAt.UTC().Format(time.RFC3339),
	}}, nil)
}

// SLIs returns the latest value of the recording rule metric by slo_id.
func (p *Prometheus) SLIs(ctx context.Context, metric string, at time.Time) (map[string]float64, error) {
	return p.byLabel(ctx, metric, "slo_id", at)
}

func (p *Prometheus) byLabel(ctx context.Context, query, label string, at time.Time) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, sourceTimeout)
	defer cancel()
	v, _, _, err := p.api.Query(ctx, query, at)
	if err != nil {
		return nil, err
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("query %s: %s, not a vector", query, v.Type())
	}
	out := map[string]float64{}
	for _, s := range vec {
		if f := float64(s.Value); !math.IsNaN(f) && !math.IsInf(f, 0) {
			out[string(s.Metric[model.LabelName(label)])] = f
		}
	}
	return out, nil
}

// LabelSets returns the label sets of the series query answers (none: an empty result).
func (p *Prometheus) LabelSets(ctx context.Context, query string, at time.Time) ([]map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, sourceTimeout)
	defer cancel()
	v, _, _, err := p.api.Query(ctx, query, at)
	if err != nil {
		return nil, err
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("query %s: %s, not a vector", query, v.Type())
	}
	out := make([]map[string]string, 0, len(vec))
	for _, s := range vec {
		ls := make(map[string]string, len(s.Metric))
		for k, v := range s.Metric {
			ls[string(k)] = string(v)
		}
		out = append(out, ls)
	}
	return out, nil
}

// Scalar returns the single value of query (nil when the result is empty).
func (p *Prometheus) Scalar(ctx context.Context, query string, at time.Time) (*float64, error) {
	ctx, cancel := context.WithTimeout(ctx, sourceTimeout)
	defer cancel()
	v, _, _, err := p.api.Query(ctx, query, at)
	if err != nil {
		return nil, err
	}
	vec, ok := v.(model.Vector)
	if !ok || len(vec) == 0 {
		return nil, nil
	}
	f := float64(vec[0].Value)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, nil
	}
	return &f, nil
}
