// Package enroll trades a one-time enrollment token for the node's long-lived
// credentials (POST /api/v1/internal/nodes/enroll) and stores them where the agent's
// configuration says: the node token (0600), the fabric CA, and the config file with the
// node id and fabric address. It never logs or returns the token in an error.
package enroll

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/gantry-gpu/gantry/nodeagent/config"
)

// Path is the enrollment operation, relative to the server URL.
const Path = "/api/v1/internal/nodes/enroll"

// Limits from the contract (NodeEnrollRequest / NodeEnrollResponse).
const (
	maxEnrollmentToken = 256
	maxHostname        = 253
	maxAgentVersion    = 64
	maxResponseBytes   = 128 << 10
)

// Request is the body of the enrollment call.
type Request struct {
	EnrollmentToken string `json:"enrollment_token"`
	Hostname        string `json:"hostname"`
	AgentVersion    string `json:"agent_version"`
}

// Response is what the control plane hands a newly enrolled node.
type Response struct {
	NodeID      string `json:"node_id"`
	NodeToken   string `json:"node_token"`
	FabricCAPEM string `json:"fabric_ca_pem"`
	FabricAddr  string `json:"fabric_addr"`
}

// Error is a refusal by the control plane, carrying its error code ("token_invalid",
// "token_expired", ...) and HTTP status.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("enrollment refused: HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// Call performs the enrollment request against serverURL (https://cp.example).
func Call(ctx context.Context, hc *http.Client, serverURL string, req Request) (Response, error) {
	if req.EnrollmentToken == "" || len(req.EnrollmentToken) > maxEnrollmentToken {
		return Response{}, fmt.Errorf("enrollment token must be 1..%d characters", maxEnrollmentToken)
	}
	if req.Hostname == "" || len(req.Hostname) > maxHostname {
		return Response{}, fmt.Errorf("hostname must be 1..%d characters", maxHostname)
	}
	if req.AgentVersion == "" || len(req.AgentVersion) > maxAgentVersion {
		return Response{}, fmt.Errorf("agent version must be 1..%d characters", maxAgentVersion)
	}
	u, err := url.Parse(strings.TrimRight(serverURL, "/"))
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return Response{}, fmt.Errorf("server URL %q must be http(s)://host[:port]", serverURL)
	}
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String()+Path, bytes.NewReader(body))
	if err != nil {
		return Response{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "application/json")
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(hr)
	if err != nil {
		return Response{}, fmt.Errorf("enroll: %w", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxResponseBytes+1))
	if err != nil {
		return Response{}, fmt.Errorf("enroll: read response: %w", err)
	}
	if len(b) > maxResponseBytes {
		return Response{}, errors.New("enroll: response too large")
	}
	if res.StatusCode != http.StatusCreated && res.StatusCode != http.StatusOK {
		var env struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(b, &env)
		return Response{}, &Error{Status: res.StatusCode, Code: env.Code, Message: env.Message}
	}
	var out Response
	if err := json.Unmarshal(b, &out); err != nil {
		return Response{}, fmt.Errorf("enroll: decode response: %w", err)
	}
	if out.NodeID == "" || out.NodeToken == "" || out.FabricAddr == "" || out.FabricCAPEM == "" {
		return Response{}, errors.New("enroll: response lacks node_id, node_token, fabric_addr or fabric_ca_pem (is the fabric configured on the control plane?)")
	}
	return out, nil
}

// Apply stores an enrollment: the CA and token files first, then the config file that
// points at them, so a crash in between leaves the previous enrollment's config intact.
// cfg.Path must be set (where the config file goes).
func Apply(cfg config.Config, serverURL string, res Response) (config.Config, error) {
	if cfg.Path == "" {
		return cfg, errors.New("enroll: config path not set")
	}
	cfg.ServerURL = strings.TrimRight(serverURL, "/")
	cfg.NodeID = res.NodeID
	cfg.FabricAddr = res.FabricAddr
	if err := cfg.WriteCA([]byte(res.FabricCAPEM)); err != nil {
		return cfg, err
	}
	if err := cfg.WriteToken(res.NodeToken); err != nil {
		return cfg, err
	}
	if err := config.Save(cfg.Path, cfg); err != nil {
		return cfg, err
	}
	return cfg, nil
}
