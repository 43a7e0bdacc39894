package nodemetrics

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	api "github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Config is GANTRY_NODE_METRICS_*.
type Config struct {
	// TokenFile holds the bearer Prometheus presents (its credentials_file); empty:
	// every request is refused.
	TokenFile string `env:"GANTRY_NODE_METRICS_TOKEN_FILE"`
	// Target is the host:port service discovery hands Prometheus for every node; empty:
	// the Host Prometheus used to reach the discovery endpoint.
	Target string `env:"GANTRY_NODE_METRICS_TARGET"`
	// Timeout bounds one scrape through the fabric.
	Timeout time.Duration `env:"GANTRY_NODE_METRICS_TIMEOUT" envDefault:"10s"`
}

// MetricsPath is where Prometheus scrapes a node.
func MetricsPath(nodeID uuid.UUID) string { return "/api/v1/internal/metrics/nodes/" + nodeID.String() }

// Handlers serve the two operations.
type Handlers struct {
	Scraper *Scraper
	Config  Config
}

type requestKey struct{}

type requestInfo struct {
	bearer string
	host   string
}

// StrictMiddleware is an api.StrictMiddlewareFunc: the strict request objects carry
// neither the Authorization header nor the Host, which these operations need.
func (h *Handlers) StrictMiddleware(f api.StrictHandlerFunc, operationID string) api.StrictHandlerFunc {
	if operationID != "GetNodeMetrics" && operationID != "ListNodeMetricsTargets" {
		return f
	}
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
		info := requestInfo{host: r.Host}
		if token, found, err := auth.BearerToken(r); err == nil && found {
			info.bearer = token
		}
		return f(context.WithValue(ctx, requestKey{}, info), w, r, request)
	}
}

// checkToken compares the bearer with the token file's content as SHA-256 digests in
// constant time (as the alert receiver does).
func (h *Handlers) checkToken(ctx context.Context) error {
	bad := apierr.New(apierr.TokenInvalid, "node metrics token is missing or wrong")
	if h.Config.TokenFile == "" {
		return bad
	}
	raw, err := os.ReadFile(h.Config.TokenFile)
	if err != nil {
		return apierr.New(apierr.ServiceUnavailable, "node metrics token unreadable").Wrap(err)
	}
	info, _ := ctx.Value(requestKey{}).(requestInfo)
	if info.bearer == "" {
		return bad
	}
	want := sha256.Sum256([]byte(strings.TrimSpace(string(raw))))
	got := sha256.Sum256([]byte(info.bearer))
	if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
		return bad
	}
	return nil
}

// GetNodeMetrics is GET /api/v1/internal/metrics/nodes/{node_id}.
func (h *Handlers) GetNodeMetrics(ctx context.Context, req api.GetNodeMetricsRequestObject) (api.GetNodeMetricsResponseObject, error) {
	if err := h.checkToken(ctx); err != nil {
		return nil, err
	}
	if h.Scraper == nil {
		return nil, apierr.New(apierr.ServiceUnavailable, "node metrics are not available")
	}
	body, err := h.Scraper.Scrape(ctx, uuid.UUID(req.NodeID))
	var se *ScrapeError
	if errors.As(err, &se) {
		return nil, apierr.New(apierr.ServiceUnavailable, "the node's metrics could not be scraped through the fabric").
			With("reason", se.Reason).Wrap(err)
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return api.GetNodeMetrics200TextResponse{Body: string(body)}, nil
}

// ListNodeMetricsTargets is GET /api/v1/internal/metrics/nodes (Prometheus HTTP SD).
func (h *Handlers) ListNodeMetricsTargets(ctx context.Context, _ api.ListNodeMetricsTargetsRequestObject) (api.ListNodeMetricsTargetsResponseObject, error) {
	if err := h.checkToken(ctx); err != nil {
		return nil, err
	}
	if h.Scraper == nil {
		return nil, apierr.New(apierr.ServiceUnavailable, "node metrics are not available")
	}
	target := h.Config.Target
	if target == "" {
		info, _ := ctx.Value(requestKey{}).(requestInfo)
		target = info.host
	}
	groups, err := Targets(ctx, h.Scraper.Fabric, target)
	if err != nil {
		return nil, apierr.New(apierr.ServiceUnavailable, "node presence is unavailable").Wrap(err)
	}
	return api.ListNodeMetricsTargets200JSONResponse{Body: groups}, nil
}

// Targets is one target group per online node, by node id.
func Targets(ctx context.Context, f Fabric, target string) ([]api.NodeMetricsTargetGroup, error) {
	all, err := f.AllPresence(ctx)
	if err != nil {
		return nil, err
	}
	groups := []api.NodeMetricsTargetGroup{}
	for id, p := range all {
		if !p.Online {
			continue
		}
		g := api.NodeMetricsTargetGroup{Targets: []string{target}}
		// No replica label: a tunnel that moves to another replica must not start new
		// series.
		g.Labels.UnderscoreUnderscoreMetricsPath = MetricsPath(id)
		g.Labels.NodeID = id
		groups = append(groups, g)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Labels.NodeID.String() < groups[j].Labels.NodeID.String() })
	return groups, nil
}
