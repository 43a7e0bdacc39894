package notifications

import (
	"net/http"
	"strings"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/bearer"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// DenialRecorder is where the refusals (401, 403) of GET /ws/notifications are audited:
// *audit.Denials, which aggregates them per actor, operation and code per window in
// memory and never makes a request wait on the database.
type DenialRecorder = audit.Observer

// contractOperationID is the contract's id of the operation (audit metadata).
const contractOperationID = "connectNotifications"

var envelopes = apierr.Writer{Service: "gantry-controlplane"}

// refused answers a pre-upgrade error. A denial (401, 403) is answered here, so that its
// challenge can say whether a token came in a subprotocol, which the server's error
// mapper cannot see, and it is audited exactly once (the mapper never sees it). Every
// refusal comes before the token is verified, so the actor is the client address. Every
// other error goes back to the strict server and so through the mapper.
func (h *Handlers) refused(w http.ResponseWriter, r *http.Request, err error) error {
	err = routed(err, r.Method)
	e, _ := apierr.As(err) // routed always gives an *apierr.Error
	status := e.HTTPStatus()
	if status != http.StatusUnauthorized && status != http.StatusForbidden {
		return err
	}
	audit.Deny(w, r, h.Log, h.Denials, audit.Denial{
		ActorType: audit.ActorUser, Route: Route, OperationID: contractOperationID, Code: string(e.Code), Status: status,
	}, presented(r))
	envelopes.Write(w, r, err)
	return nil
}

// presented: the request carried an access token, in Authorization or in a
// gantry.bearer.<token> subprotocol.
func presented(r *http.Request) bool {
	if bearer.InAuthorization(r) {
		return true
	}
	for _, p := range tokens(r.Header, "Sec-WebSocket-Protocol") {
		if strings.HasPrefix(p, BearerProtocolPrefix) {
			return true
		}
	}
	return false
}
