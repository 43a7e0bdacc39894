// Package deploy embeds the monitoring configuration and runbooks kept in this
// directory, so the control plane serves exactly what is deployed: the alert rule
// manifest and the SLO declarations (prometheus/), the Alertmanager routing
// (alertmanager/) and the runbooks (runbooks/). It holds data only; parsing and
// meaning live in controlplane/internal/observability.
package deploy

import "embed"

// Monitoring holds prometheus/*.yml (prometheus.yml, the *.rules.yml files, slos.yml),
// alertmanager/alertmanager.yml and runbooks/*.md.
//
//go:embed prometheus/*.yml alertmanager/*.yml runbooks/*.md
var Monitoring embed.FS
