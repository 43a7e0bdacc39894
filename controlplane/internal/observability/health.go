package observability

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"

	"github.com/gantry-gpu/gantry/proto/api"
)

// Probe checks a dependency from the control plane itself (a database ping, the NATS
// connection state); nil error is healthy.
type Probe func(ctx context.Context) error

// ComponentProbes are the control plane's own checks of the components Prometheus does
// not scrape. A nil probe is a dependency this installation does not have (the cache
// without REDIS_URL): the component is not_reported.
type ComponentProbes struct {
	Database, EventBus, Cache, Gateway Probe
	// RuntimeCommit is the commit this control plane was built from ("" unknown).
	RuntimeCommit string
}

// component is one entry of the profile: what it is, whether the profile requires it
// for release validation, and where its evidence comes from.
type component struct {
	id       string
	typ      api.ObservabilityComponentType
	domain   string
	runbook  string
	required bool
	// job is the Prometheus scrape job whose target is the component (""
	// when it is checked by a probe instead).
	job string
	// alerts are the alert rules whose firing degrades (warning) or fails (critical)
	// the component; GantryComponentDown counts only for the component's job.
	alerts []string
	probe  func(ComponentProbes) Probe
}

// profileComponents is the dev/production profile's component list (seed 4.2.5): every
// one is required except the cache, which the control plane works without (rate
// limits fall back to memory).
var profileComponents = []component{
	{id: "api", typ: api.ObservabilityComponentTypeAPI, domain: "api", runbook: "ops.api.availability", required: true,
		job: "gantry-controlplane", alerts: []string{"ApiAvailabilityBudgetBurn", "ApiLatencyBudgetBurn", "GantryComponentDown"}},
	{id: "provisioning-dispatcher", typ: api.ObservabilityComponentTypeWorker, domain: "provisioning", runbook: "ops.provisioning.stuck", required: true,
		job: "gantry-controlplane", alerts: []string{"ProvisioningDispatcherAbsent", "ProvisioningQueueStuck", "ProvisioningTimeouts", "ProvisioningTimeBudgetBurn"}},
	{id: "fabric-gateway", typ: api.ObservabilityComponentTypeGateway, domain: "fleet", runbook: "ops.nodes.offline", required: true,
		probe: func(p ComponentProbes) Probe { return p.Gateway }},
	{id: "provisioning-queue", typ: api.ObservabilityComponentTypeQueue, domain: "provisioning", runbook: "ops.provisioning.stuck", required: true,
		job: "gantry-controlplane", alerts: []string{"ProvisioningConsumerLagGrowing", "ProvisioningQueueStuck"}},
	{id: "postgresql", typ: api.ObservabilityComponentTypeDatabase, domain: "platform", runbook: "ops.component.down", required: true,
		probe: func(p ComponentProbes) Probe { return p.Database }},
	{id: "redis", typ: api.ObservabilityComponentTypeCache, domain: "platform", runbook: "ops.cache.unavailable", required: false,
		alerts: []string{"RateLimitStoreUnavailable"}, probe: func(p ComponentProbes) Probe { return p.Cache }},
	{id: "nats", typ: api.ObservabilityComponentTypeEventBus, domain: "platform", runbook: "ops.component.down", required: true,
		probe: func(p ComponentProbes) Probe { return p.EventBus }},
	{id: "prometheus-alertmanager", typ: api.ObservabilityComponentTypeObservability, domain: "observability", runbook: "ops.observability.pipeline", required: true,
		alerts: []string{"PrometheusRuleEvaluationFailing", "AlertmanagerNotificationsFailing"}},
	{id: "controlplane-runtime", typ: api.ObservabilityComponentTypeRuntime, domain: "platform", runbook: "ops.component.down", required: true},
	{id: "node-log-gateway", typ: api.ObservabilityComponentTypeNodeLogGateway, domain: "logging", runbook: "ops.loggateway.rejections", required: true,
		job: "gantry-loggateway", alerts: []string{"LogGatewayAcceptanceBudgetBurn", "GantryComponentDown"}},
}

// staleScrape is how old a target's last scrape may be before its evidence is stale
// (three default scrape intervals).
const staleScrape = 45 * time.Second

// statusRank orders component statuses by severity for the overall rollup (seed 4.2.7
// rule 1). A required component that is not reported cannot be classified: unknown.
var statusRank = map[api.ObservabilityComponentStatus]int{
	api.ObservabilityComponentStatusHealthy:     0,
	api.ObservabilityComponentStatusNotReported: 0,
	api.ObservabilityComponentStatusDegraded:    1,
	api.ObservabilityComponentStatusUnknown:     2,
	api.ObservabilityComponentStatusUnhealthy:   3,
}

// Overall is the health snapshot's overall status: the maximum severity over the
// required components (a required one not reported counts as unknown); optional
// components (the cache, Grafana) never change it (seed 4.2.7 rules 1 and 2).
func Overall(statuses []api.ObservabilityComponentStatus, required []bool) api.ObservabilityComponentStatus {
	worst := api.ObservabilityComponentStatusHealthy
	for i, st := range statuses {
		if !required[i] {
			continue
		}
		if st == api.ObservabilityComponentStatusNotReported {
			st = api.ObservabilityComponentStatusUnknown
		}
		if statusRank[st] > statusRank[worst] {
			worst = st
		}
	}
	return worst
}

// HealthQuery is the filter of the health snapshot (seed 4.2.5).
type HealthQuery struct {
	ComponentType, Status      string
	IncludeEvidence, IncludePQ bool
}

type healthSources struct {
	now      time.Time
	promErr  error
	targets  map[string][]promv1.ActiveTarget // by job
	loaded   map[string]promv1.AlertingRule
	slis     map[string]float64 // slo_id -> 5m SLI
	sliErr   error
	amErr    error
	queueLag *int
}

func (s *Service) gatherHealth(ctx context.Context) healthSources {
	src := healthSources{now: s.Clock.Now().UTC(), targets: map[string][]promv1.ActiveTarget{}}
	if s.Prom == nil {
		src.promErr = errNotConfigured
	} else if ts, err := s.Prom.Targets(ctx); err != nil {
		src.promErr = err
	} else {
		for _, t := range ts {
			job := string(t.Labels["job"])
			src.targets[job] = append(src.targets[job], t)
		}
		src.loaded, _, src.promErr = s.Prom.Rules(ctx)
		if src.promErr == nil {
			src.slis, src.sliErr = s.Prom.SLIs(ctx, "slo:sli_ratio:rate5m", src.now)
			if lag, err := s.Prom.Scalar(ctx, `max(nats_consumer_lag{stream="PROVISIONING"})`, src.now); err == nil && lag != nil {
				n := int(*lag)
				src.queueLag = &n
			}
		}
	}
	if s.AM == nil {
		src.amErr = errNotConfigured
	} else {
		_, src.amErr = s.AM.Routing(ctx)
	}
	return src
}

// firing returns the most severe firing alert among names for job ("" any job):
// "critical", "warning" or "".
func (src healthSources) firing(names []string, job string) (severity, name string) {
	for _, n := range names {
		r, ok := src.loaded[n]
		if !ok || r.State != "firing" {
			continue
		}
		for _, a := range r.Alerts {
			if a.State != promv1.AlertStateFiring {
				continue
			}
			if n == "GantryComponentDown" && string(a.Labels["job"]) != job {
				continue
			}
			sev := string(r.Labels["severity"])
			if sev == "critical" || sev == "sev1" {
				return "critical", n
			}
			severity, name = "warning", n
		}
	}
	return severity, name
}

func (s *Service) classify(ctx context.Context, c component, src healthSources) api.ObservabilityComponent {
	out := api.ObservabilityComponent{
		ComponentID: c.id, ComponentType: c.typ, OwnerDomain: c.domain, RunbookID: c.runbook,
		EvidenceHref: "/api/v1/v3/platform/ops/observability/health-snapshot?component_type=" + url.QueryEscape(string(c.typ)),
		Details:      api.ObservabilityComponentDetails{HealthzStatus: api.ObservabilityComponentDetailsHealthzStatusUnknown},
		Metrics: api.ObservabilityComponentMetrics{
			ScrapeState:     api.ObservabilityComponentMetricsScrapeStateNotScraped,
			ErrorRateClass:  api.ObservabilityComponentMetricsErrorRateClassUnknown,
			LatencyClass:    api.ObservabilityComponentMetricsLatencyClassUnknown,
			SaturationClass: api.ObservabilityComponentMetricsSaturationClassUnknown,
		},
	}
	status := api.ObservabilityComponentStatusHealthy
	var reasons []string
	worsen := func(st api.ObservabilityComponentStatus, reason string) {
		if statusRank[st] > statusRank[status] {
			status = st
		}
		reasons = append(reasons, reason)
	}
	checked := src.now

	// Scraped components: the target's health and the age of its last scrape.
	if c.job != "" {
		switch ts := src.targets[c.job]; {
		case src.promErr != nil:
			out.Metrics.ScrapeState = api.ObservabilityComponentMetricsScrapeStateUnknown
			worsen(api.ObservabilityComponentStatusUnknown, "prometheus unreachable: scrape state unknown")
		case len(ts) == 0:
			worsen(api.ObservabilityComponentStatusUnknown, "no scrape target for job "+c.job)
		default:
			t := ts[0]
			for _, x := range ts[1:] { // the worst target of the job speaks for it
				if x.Health != promv1.HealthGood || x.LastScrape.Before(t.LastScrape) {
					t = x
				}
			}
			checked = t.LastScrape.UTC()
			age := int(src.now.Sub(t.LastScrape).Seconds())
			out.Metrics.ScrapeFreshnessSeconds = &age
			switch {
			case t.Health == promv1.HealthBad:
				out.Metrics.ScrapeState = api.ObservabilityComponentMetricsScrapeStateDown
				out.Details.HealthzStatus = api.ObservabilityComponentDetailsHealthzStatusFailing
				worsen(api.ObservabilityComponentStatusUnhealthy, "scrape target down")
			case t.Health != promv1.HealthGood:
				out.Metrics.ScrapeState = api.ObservabilityComponentMetricsScrapeStateUnknown
				worsen(api.ObservabilityComponentStatusUnknown, "scrape target not scraped yet")
			case src.now.Sub(t.LastScrape) > staleScrape:
				out.Metrics.ScrapeState = api.ObservabilityComponentMetricsScrapeStateStale
				out.Details.HealthzStatus = api.ObservabilityComponentDetailsHealthzStatusOk
				worsen(api.ObservabilityComponentStatusDegraded, "scrape evidence stale")
			default:
				out.Metrics.ScrapeState = api.ObservabilityComponentMetricsScrapeStateUp
				out.Details.HealthzStatus = api.ObservabilityComponentDetailsHealthzStatusOk
			}
		}
	}

	// Probed components: asked now.
	if c.probe != nil {
		switch p := c.probe(s.Components); {
		case p == nil:
			status = api.ObservabilityComponentStatusNotReported
			reasons = append(reasons, "not configured in this installation")
		case p(ctx) != nil:
			out.Details.HealthzStatus = api.ObservabilityComponentDetailsHealthzStatusFailing
			worsen(api.ObservabilityComponentStatusUnhealthy, "health check failing")
		default:
			out.Details.HealthzStatus = api.ObservabilityComponentDetailsHealthzStatusOk
		}
	}

	switch c.typ {
	case api.ObservabilityComponentTypeObservability:
		switch {
		case src.promErr != nil:
			out.Details.HealthzStatus = api.ObservabilityComponentDetailsHealthzStatusFailing
			worsen(api.ObservabilityComponentStatusUnhealthy, "prometheus unreachable")
		case src.amErr != nil:
			out.Details.HealthzStatus = api.ObservabilityComponentDetailsHealthzStatusFailing
			worsen(api.ObservabilityComponentStatusUnhealthy, "alertmanager unreachable")
		default:
			out.Details.HealthzStatus = api.ObservabilityComponentDetailsHealthzStatusOk
		}
	case api.ObservabilityComponentTypeRuntime:
		out.Details.HealthzStatus = api.ObservabilityComponentDetailsHealthzStatusOk // it is answering this request
		if s.Components.RuntimeCommit != "" {
			commit := s.Components.RuntimeCommit
			out.Details.RuntimeCommit = &commit
		} else {
			worsen(api.ObservabilityComponentStatusDegraded, "runtime commit unknown (built without version stamp)")
		}
	case api.ObservabilityComponentTypeAPI:
		out.Metrics.ErrorRateClass = api.ObservabilityComponentMetricsErrorRateClass(s.sliClass(src, "api-availability"))
		out.Metrics.LatencyClass = api.ObservabilityComponentMetricsLatencyClass(s.sliClass(src, "api-latency"))
	case api.ObservabilityComponentTypeNodeLogGateway:
		out.Metrics.ErrorRateClass = api.ObservabilityComponentMetricsErrorRateClass(s.sliClass(src, "loggateway-acceptance"))
	case api.ObservabilityComponentTypeWorker:
		out.Metrics.LatencyClass = api.ObservabilityComponentMetricsLatencyClass(s.sliClass(src, "provisioning-time"))
	}
	// An SLI outside its objective right now is a warning until its burn alert decides
	// (the alert's `for` keeps one bad minute from failing the component).
	if string(out.Metrics.ErrorRateClass) == "elevated" || string(out.Metrics.ErrorRateClass) == "critical" {
		worsen(api.ObservabilityComponentStatusDegraded, "error rate "+string(out.Metrics.ErrorRateClass))
	}
	if string(out.Metrics.LatencyClass) == "elevated" || string(out.Metrics.LatencyClass) == "critical" {
		worsen(api.ObservabilityComponentStatusDegraded, "latency "+string(out.Metrics.LatencyClass))
	}
	switch c.typ {
	case api.ObservabilityComponentTypeQueue:
		if src.queueLag != nil {
			out.Metrics.SaturationClass = api.ObservabilityComponentMetricsSaturationClassNormal
		}
	}

	// Alerts about the component: a firing critical alert fails it, a warning degrades it.
	if src.promErr == nil {
		switch sev, name := src.firing(c.alerts, c.job); sev {
		case "critical":
			worsen(api.ObservabilityComponentStatusUnhealthy, "alert "+name+" firing")
			if c.typ == api.ObservabilityComponentTypeQueue {
				out.Metrics.SaturationClass = api.ObservabilityComponentMetricsSaturationClassCritical
			}
		case "warning":
			worsen(api.ObservabilityComponentStatusDegraded, "alert "+name+" firing")
			if c.typ == api.ObservabilityComponentTypeQueue {
				out.Metrics.SaturationClass = api.ObservabilityComponentMetricsSaturationClassElevated
			}
		}
	}

	out.Status = status
	at := checked
	out.CheckedAt = &at
	fresh := int(src.now.Sub(checked).Seconds())
	out.FreshnessSeconds = &fresh
	if status != api.ObservabilityComponentStatusHealthy && len(reasons) > 0 {
		r := strings.Join(reasons, "; ")
		out.DegradationReason = &r
	}
	return out
}

// sliClass classifies an SLI's 5-minute error ratio against its objective: normal
// within the budget rate, elevated below the fast-burn threshold, critical above.
func (s *Service) sliClass(src healthSources, sloID string) string {
	v, ok := src.slis[sloID]
	if !ok || src.sliErr != nil {
		return "unknown"
	}
	for _, o := range s.Manifest.SLOs {
		if o.ID != sloID {
			continue
		}
		budget := 1 - o.Target
		switch bad := 1 - v; {
		case bad <= budget:
			return "normal"
		case bad <= fastBurn*budget:
			return "elevated"
		default:
			return "critical"
		}
	}
	return "unknown"
}

// fastBurn is the burn-rate factor of the fast-burn alerts (gantry-slo.rules.yml).
const fastBurn = 14.4

// HealthSnapshot is the health snapshot read model (seed 4.2.6).
func (s *Service) HealthSnapshot(ctx context.Context, q HealthQuery) api.ObservabilityHealthSnapshotResponse {
	src := s.gatherHealth(ctx)
	out := api.ObservabilityHealthSnapshotResponse{
		Components: []api.ObservabilityComponent{},
		Evidence:   []api.ObservabilityEvidence{},
		Meta: api.ObservabilityHealthMeta{Cache: api.ObservabilityHealthMetaCacheBypass,
			Sources: []string{"control_plane_probes", "alert_rule_manifest"}},
	}
	var statuses []api.ObservabilityComponentStatus
	var required []bool
	var bad []string
	for _, c := range profileComponents {
		it := s.classify(ctx, c, src)
		statuses, required = append(statuses, it.Status), append(required, c.required)
		if c.required && it.Status != api.ObservabilityComponentStatusHealthy {
			bad = append(bad, fmt.Sprintf("%s %s", c.id, it.Status))
		}
		counts := &out.Rollups.Service
		if c.typ == api.ObservabilityComponentTypeWorker {
			counts = &out.Rollups.Worker
		}
		count(counts, it.Status)
		if (q.ComponentType == "" || string(c.typ) == q.ComponentType) && (q.Status == "" || string(it.Status) == q.Status) {
			out.Components = append(out.Components, it)
		}
	}
	ov := &out.Overall
	ov.GeneratedAt, ov.EnvironmentProfile = src.now, s.Config.Profile
	ov.Status = Overall(statuses, required)
	ov.DegradationLevel = map[api.ObservabilityComponentStatus]api.ObservabilityHealthOverallDegradationLevel{
		api.ObservabilityComponentStatusHealthy:   api.ObservabilityHealthOverallDegradationLevelNone,
		api.ObservabilityComponentStatusDegraded:  api.ObservabilityHealthOverallDegradationLevelMinor,
		api.ObservabilityComponentStatusUnknown:   api.ObservabilityHealthOverallDegradationLevelUnknown,
		api.ObservabilityComponentStatusUnhealthy: api.ObservabilityHealthOverallDegradationLevelCritical,
	}[ov.Status]
	if len(bad) == 0 {
		ov.Summary = fmt.Sprintf("all %d required components healthy", countTrue(required))
	} else {
		sort.Strings(bad)
		ov.Summary = fmt.Sprintf("%d of %d required components not healthy: %s", len(bad), countTrue(required), strings.Join(bad, ", "))
	}

	obs := &out.Rollups.Observability
	obs.PrometheusReachable = src.promErr == nil
	obs.GrafanaEscapeHatchConfigured = s.Config.GrafanaURL != ""
	if src.queueLag != nil {
		out.Rollups.Queue.StaleConsumers = new(int)
		if sev, _ := src.firing([]string{"ProvisioningDispatcherAbsent", "ProvisioningQueueStuck"}, ""); sev != "" {
			*out.Rollups.Queue.StaleConsumers = 1
		}
	}
	if src.promErr == nil {
		out.Meta.Sources = append(out.Meta.Sources, "prometheus_targets", "prometheus_rules")
	}

	out.DirectUI.Grafana = uiEntry(s.Config.GrafanaURL, "raw dashboards when the read models are not enough; optional, never required for release validation")
	out.DirectUI.Prometheus = uiEntry(s.Config.PrometheusURL, "ad-hoc queries and the raw alert and target pages")

	if q.IncludeEvidence {
		out.Evidence = append(out.Evidence, evidence("prometheus", src.promErr, 0), evidence("alertmanager", src.amErr, 0),
			api.ObservabilityEvidence{Source: "control_plane_probes", State: "fresh", FreshnessSeconds: new(int), Href: "/readyz"})
	}
	if q.IncludePQ && src.promErr == nil {
		for _, o := range s.Manifest.SLOs {
			out.Evidence = append(out.Evidence, api.ObservabilityEvidence{
				Source: "prometheus_query:sli:" + o.ID, State: s.sliClass(src, o.ID),
				FreshnessSeconds: new(int), Href: "/api/v1/v3/platform/ops/observability/slo-evidence?slo_id=" + o.ID})
		}
	}
	return out
}

func count(c *api.ObservabilityStatusCounts, st api.ObservabilityComponentStatus) {
	switch st {
	case api.ObservabilityComponentStatusHealthy:
		c.Healthy++
	case api.ObservabilityComponentStatusDegraded:
		c.Degraded++
	case api.ObservabilityComponentStatusUnhealthy:
		c.Unhealthy++
	case api.ObservabilityComponentStatusUnknown:
		c.Unknown++
	default:
		c.NotReported++
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

func evidence(source string, err error, fresh int) api.ObservabilityEvidence {
	e := api.ObservabilityEvidence{Source: source, State: "reachable", Href: "/api/v1/v3/platform/ops/observability/health-snapshot"}
	if err != nil {
		e.State = "unreachable"
		if err == errNotConfigured {
			e.State = "not_configured"
		}
		return e
	}
	e.FreshnessSeconds = &fresh
	return e
}

// uiEntry offers a tool's address without credentials or query (seed 4.2.8).
func uiEntry(raw, useWhen string) api.ObservabilityDirectUIEntry {
	e := api.ObservabilityDirectUIEntry{UseWhen: useWhen}
	u, err := url.Parse(raw)
	if raw == "" || err != nil || u.Host == "" {
		return e
	}
	clean := (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
	e.Configured, e.Path = true, &clean
	return e
}
