package terminal

import (
	"errors"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/bearer"
)

// DenialRecorder is where the refusals (401, 403) of the terminal's WebSocket operations
// are audited: *audit.Denials, which aggregates them per actor, operation and code per
// window in memory and never makes a request wait on the database.
type DenialRecorder = audit.Observer

// The contract's operation ids of the two WebSocket operations (audit metadata).
const (
	opOpenTerminal  = "openTerminal"
	opRelayTerminal = "relayTerminal"
)

// tokenOwned is a refusal of a token this service issued: whose it was is known (the
// user it was minted for, in the project of its allocation), so the denial is audited
// as that user's rather than as an anonymous address. A token proves nothing about
// who presents it once it is spent or expired, but the owner is who must learn that
// their token was replayed or sent for another allocation.
type tokenOwned struct {
	err                     error
	user, tenant, projectID uuid.UUID
}

func (e *tokenOwned) Error() string { return e.err.Error() }
func (e *tokenOwned) Unwrap() error { return e.err }

// endpoint names one WebSocket operation for its denials.
type endpoint struct {
	route, operationID string
	actorType          string
	// credential reports whether the request presented a credential of this endpoint
	// (the challenge's error attribute is for those only, RFC 6750 §3.1).
	credential func(*http.Request) bool
}

var (
	terminalEndpoint = endpoint{route: RouteTerminal, operationID: opOpenTerminal, actorType: audit.ActorUser, credential: offersToken}
	// The relay is called by other replicas, not by a user.
	relayEndpoint = endpoint{route: RouteRelay, operationID: opRelayTerminal, actorType: audit.ActorService, credential: bearer.InAuthorization}
)

// refused answers a pre-upgrade error of ep. A denial (401, 403) is answered here, so
// that its challenge can say whether a token came in a subprotocol and its audit row
// can name the token's owner, neither of which the server's error mapper can see; it
// is audited exactly once (the mapper never sees it). Every other error goes back to
// the strict server and so through the mapper (database unavailability and the rest).
func (s *Service) refused(w http.ResponseWriter, r *http.Request, ep endpoint, err error) error {
	routed := withRoute(err, ep.route, r.Method)
	status := routed.HTTPStatus()
	if status != http.StatusUnauthorized && status != http.StatusForbidden {
		return routed
	}
	den := audit.Denial{
		ActorType: ep.actorType, Route: ep.route, OperationID: ep.operationID, Code: string(routed.Code), Status: status,
	}
	var owned *tokenOwned
	if errors.As(err, &owned) {
		den.ActorUserID, den.TenantID, den.ProjectID = owned.user, owned.tenant, owned.projectID
	}
	audit.Deny(w, r, s.deps.Log, s.deps.Denials, den, ep.credential(r))
	envelopes.Write(w, r, routed)
	return nil
}

// offersToken: the handshake offered a terminal token subprotocol.
func offersToken(r *http.Request) bool {
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if strings.HasPrefix(strings.TrimSpace(p), TokenSubprotocolPrefix) {
				return true
			}
		}
	}
	return false
}
