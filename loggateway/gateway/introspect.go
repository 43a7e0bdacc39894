package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

// ControlPlane introspects node tokens through the control plane's
// POST /api/v1/internal/nodes/{node_id}/token/introspect, with the token itself as the
// bearer. A 401, 403 or 404, an inactive answer, or an answer for another node means
// ErrUnauthenticated; anything else that is not a 200 is an error that is not cached.
type ControlPlane struct {
	BaseURL string
	Client  *http.Client
}

// NewControlPlane returns an introspector for the control plane at baseURL.
func NewControlPlane(baseURL string, timeout time.Duration) *ControlPlane {
	return &ControlPlane{
		BaseURL: strings.TrimRight(baseURL, "/"),
		Client:  &http.Client{Timeout: timeout},
	}
}

type introspection struct {
	Active bool   `json:"active"`
	NodeID string `json:"node_id"`
}

func (cp *ControlPlane) Introspect(ctx context.Context, token string) (uuid.UUID, error) {
	// A token that is not even well formed never costs the control plane a call.
	node, err := nodetoken.Parse(token)
	if err != nil {
		return uuid.Nil, ErrUnauthenticated
	}
	url := cp.BaseURL + "/api/v1/internal/nodes/" + node.String() + "/token/introspect"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return uuid.Nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	resp, err := cp.Client.Do(req)
	if err != nil {
		return uuid.Nil, fmt.Errorf("introspect: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return uuid.Nil, fmt.Errorf("introspect: read: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		return uuid.Nil, ErrUnauthenticated
	default:
		return uuid.Nil, fmt.Errorf("introspect: control plane answered %d", resp.StatusCode)
	}
	var in introspection
	if err := json.Unmarshal(body, &in); err != nil {
		return uuid.Nil, fmt.Errorf("introspect: decode: %w", err)
	}
	if !in.Active {
		return uuid.Nil, ErrUnauthenticated
	}
	got, err := uuid.Parse(in.NodeID)
	if err != nil || got != node {
		return uuid.Nil, ErrUnauthenticated
	}
	return node, nil
}
