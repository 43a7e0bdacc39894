package terminal

import (
	"context"
	"io"
	"net/http"
	"strings"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// SSH through the node tunnel (docs/ssh.md). An SSH connection rides the same machinery
// as the terminal: a single-use token from the same table (minted and spent by Mint and
// Consume, so it has every property of a terminal token), a WebSocket whose handshake
// carries it in a subprotocol, a raw fabric stream (kind SSH) to the node's agent, and
// the same relay when another replica holds the node's tunnel. What differs is the
// payload: the WebSocket's binary messages are the SSH connection's bytes, passed
// through untouched both ways, so there is no session state here to keep. The SSH
// server (the host's sshd, or the agent's own) authenticates the allocation's keys.
//
// A token of either endpoint opens the other: both need the same role on the same
// running allocation, so that grants nothing the caller could not mint directly.

const (
	// SSHSubprotocol is the SSH byte-stream protocol; the only one /ws/ssh echoes.
	SSHSubprotocol = "gantry.ssh.v1"
	// RouteSSH is the operation's path (details.route).
	RouteSSH = "/ws/ssh/{allocation_id}"
	// sshReadLimit bounds one WebSocket message from the client; ssh-proxy sends at
	// most 128 KiB per message.
	sshReadLimit = 1 << 20
	// sshCopyBuffer is each direction's copy buffer. A read from the WebSocket returns
	// at most one message and a write to the stream is one yamux frame, so a buffer
	// smaller than ssh-proxy's messages (up to a pipe's 64 KiB) split each into a full
	// frame and a sliver, as io.Copy's 32 KiB did to SSH packets of 32 KiB plus framing.
	sshCopyBuffer = 64 << 10
	opOpenSSH     = "openSsh"
)

var sshEndpoint = endpoint{route: RouteSSH, operationID: opOpenSSH, actorType: audit.ActorUser, credential: offersToken}

// CreateSSHSession implements POST /api/v1/allocations/{allocation_id}/ssh-sessions.
func (h *Handlers) CreateSSHSession(ctx context.Context, req api.CreateSSHSessionRequestObject) (api.CreateSSHSessionResponseObject, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.InvalidRequest, "project context is required: send the X-Project-ID header").
			With("field", "X-Project-ID").With("reason", "project_context_missing")
	}
	m, err := h.Svc.Mint(ctx, p, proj, req.AllocationID, MintRequest{})
	if err != nil {
		return nil, err
	}
	return api.CreateSSHSession201JSONResponse{Body: api.SSHSession{
		Token: m.Token, AllocationID: req.AllocationID, ExpiresAt: m.ExpiresAt,
		WebsocketPath: SSHPath(req.AllocationID),
		Subprotocols:  []string{SSHSubprotocol, TokenSubprotocolPrefix + m.Token},
	}}, nil
}

// OpenSSH is GET /ws/ssh/{allocation_id}; Service.StrictMiddleware serves it.
func (h *Handlers) OpenSSH(context.Context, api.OpenSSHRequestObject) (api.OpenSSHResponseObject, error) {
	return nil, errNoMiddleware
}

// SSHPath is the WebSocket path of an allocation's SSH stream.
func SSHPath(allocationID uuid.UUID) string {
	return strings.Replace(RouteSSH, "{allocation_id}", allocationID.String(), 1)
}

// openSSH checks the handshake as openTerminal does, opens an SSH stream to the agent,
// upgrades, audits the connection and pipes bytes until either side ends. Errors are
// returned only before the upgrade.
func (s *Service) openSSH(ctx context.Context, w http.ResponseWriter, r *http.Request, allocationID uuid.UUID) error {
	grant, alloc, err := s.admit(ctx, r, allocationID, SSHSubprotocol, "SSH streams", "SSH needs")
	if err != nil {
		return err
	}
	bctx, cancel := context.WithCancel(principal.With(context.WithoutCancel(ctx), &principal.Principal{
		UserID: grant.UserID, TenantID: grant.TenantID,
	}))
	defer cancel()
	pre := &fabricv1.StreamPreamble{
		Kind: fabricv1.StreamKind_STREAM_KIND_SSH, StreamId: grant.SessionID.String(), AllocationId: alloc.ID.String(),
		CorrelationId: correlation.ID(ctx),
	}
	octx, ocancel := context.WithTimeout(bctx, s.cfg.OpenTimeout)
	st, err := s.openRaw(octx, bctx, alloc, pre)
	ocancel()
	if err != nil {
		s.metrics.sshConnections.WithLabelValues("open_failed").Inc()
		return err
	}
	s.metrics.sshConnections.WithLabelValues("opened").Inc()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{SSHSubprotocol}, OriginPatterns: s.cfg.AllowedOrigins})
	if err != nil {
		_ = st.Close()
		s.deps.Log.WarnContext(ctx, "ssh: websocket accept failed", "err", err)
		return nil
	}
	ws.SetReadLimit(sshReadLimit)
	if err := s.auditSSH(bctx, grant, alloc); err != nil {
		// An unaudited connection is not served.
		s.deps.Log.ErrorContext(ctx, "ssh: audit failed; closing", "err", err)
		_ = st.Close()
		_ = ws.Close(websocket.StatusInternalError, "internal error")
		return nil
	}
	p := &relayPipe{ws: ws, st: st}
	if !s.trackPipe(p) {
		p.close()
		return nil
	}
	defer s.untrackPipe(p)
	s.metrics.sshActive.Inc()
	defer s.metrics.sshActive.Dec()
	nc := websocket.NetConn(bctx, ws, websocket.MessageBinary)
	const fromClient, fromAgent = 1, 2
	done := make(chan int, 2)
	go func() {
		_, _ = io.CopyBuffer(countingWriter{st, s.metrics.sshBytes.WithLabelValues("to_node")}, nc, make([]byte, sshCopyBuffer))
		done <- fromClient
	}()
	go func() {
		_, _ = io.CopyBuffer(countingWriter{nc, s.metrics.sshBytes.WithLabelValues("from_node")}, st, make([]byte, sshCopyBuffer))
		done <- fromAgent
	}()
	if <-done == fromAgent {
		// The SSH server ended the connection: a closing handshake lets the client read
		// everything sent before it (the exit status is in the last bytes).
		_ = ws.Close(websocket.StatusNormalClosure, "ssh connection ended")
	}
	p.close()
	<-done
	return nil
}

// auditSSH records the opening of an SSH connection, in its own transaction (the
// connection is the mutation: nothing else is persisted).
func (s *Service) auditSSH(ctx context.Context, g Grant, alloc Allocation) error {
	return db.InTx(ctx, s.deps.Pool, func(tx pgx.Tx) error {
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: "allocation.ssh.connect", TargetType: "allocation", TargetID: alloc.ID.String(),
			TenantID: alloc.TenantID, ProjectID: alloc.ProjectID,
			Metadata: map[string]any{
				"node_id": alloc.NodeID.String(), "user_id": g.UserID.String(), "stream_id": g.SessionID.String(),
			},
		})
	})
}

// trackPipe registers a pipe for shutdown; false when the replica is shutting down.
func (s *Service) trackPipe(p *relayPipe) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.pipes[p] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Service) untrackPipe(p *relayPipe) {
	s.mu.Lock()
	delete(s.pipes, p)
	s.mu.Unlock()
	s.wg.Done()
}

// countingWriter counts the bytes written through it as they go, so a long-lived SSH
// connection's traffic shows in the counter while it lasts, not only when it ends.
type countingWriter struct {
	w io.Writer
	c prometheus.Counter
}

func (cw countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.c.Add(float64(n))
	return n, err
}
