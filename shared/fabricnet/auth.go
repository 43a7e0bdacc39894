package fabricnet

import (
	"context"
	"errors"
	"fmt"
	"time"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// ProtocolVersion is the fabric protocol this package speaks (AuthRequest.protocol_version).
const ProtocolVersion = 1

// Auth error codes of AuthResponse.error_code.
const (
	AuthErrTokenInvalid = "token_invalid"
	AuthErrUnavailable  = "unavailable"
	// AuthErrSessionNotFound refuses a bulk side session (AuthRequest.bulk_for_session_id)
	// whose main session this control plane does not hold live for the token's node.
	AuthErrSessionNotFound = "session_not_found"
)

// ErrTokenRefused is returned by Authenticate when the control plane refused the node
// token (wrong, revoked or rotated away): reconnecting with it will not help.
var ErrTokenRefused = errors.New("fabricnet: node token refused")

// Authenticate runs the auth stream, the first stream of every tunnel: it writes req
// and reads the control plane's AuthResponse. A refused token returns ErrTokenRefused
// (the control plane then closes the tunnel); other failures are worth a retry.
func Authenticate(ctx context.Context, s Session, req *fabricv1.AuthRequest) (*fabricv1.AuthResponse, error) {
	if req.ProtocolVersion == 0 {
		req.ProtocolVersion = ProtocolVersion
	}
	st, err := s.OpenStream(ctx)
	if err != nil {
		return nil, fmt.Errorf("fabricnet: open auth stream: %w", err)
	}
	defer st.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(dl)
	} else {
		_ = st.SetDeadline(time.Now().Add(30 * time.Second))
	}
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := WriteFrame(st, req); err != nil {
		return nil, fmt.Errorf("fabricnet: write auth request: %w", err)
	}
	var res fabricv1.AuthResponse
	if err := ReadFrame(st, &res); err != nil {
		return nil, fmt.Errorf("fabricnet: read auth response: %w", err)
	}
	if !res.GetOk() {
		if res.GetErrorCode() == AuthErrTokenInvalid {
			return &res, ErrTokenRefused
		}
		return &res, fmt.Errorf("fabricnet: authentication failed: %s", res.GetErrorCode())
	}
	return &res, nil
}
