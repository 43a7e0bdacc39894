// Package observability serves the platform observability read models of seed 4.2
// (alerts, slo-evidence, health-snapshot), the alert drills and the runbook index,
// from the monitoring configuration kept in deploy/ (embedded through the deploy
// module: rule manifest, SLO declarations, Alertmanager routes, runbooks) and from a
// real Prometheus and Alertmanager (GANTRY_PROMETHEUS_URL, GANTRY_ALERTMANAGER_URL).
//
// It must never make up a number: what a source did not say is reported as unknown,
// not_loaded or missing, and an unreachable source degrades the answer instead of
// failing it. It must never return raw samples, log or trace payloads, receiver
// URLs, tokens or other seed 4.2.8 exclusions: receivers are named, never addressed,
// and SLIs are classified and summarised over a window by Prometheus itself.
package observability
