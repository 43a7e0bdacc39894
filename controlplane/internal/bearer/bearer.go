// Package bearer is the RFC 6750 side of a refusal that every part of the API shares:
// the realm and the WWW-Authenticate challenge of a 401, and whether a request
// presented a bearer credential at all. The server's error mapper and the WebSocket
// endpoints that answer their own refusals (terminal, notifications) use it, so the
// challenge cannot drift between them.
package bearer

import (
	"net/http"
	"strings"
)

// Realm is the realm of every bearer challenge of the API.
const Realm = "gantry"

// Challenge is the WWW-Authenticate value of a 401 (RFC 6750 §3): error="invalid_token"
// only when a credential was presented, since a request without one is told only which
// scheme and realm to use (§3.1).
func Challenge(presented bool) string {
	if presented {
		return `Bearer realm="` + Realm + `", error="invalid_token"`
	}
	return `Bearer realm="` + Realm + `"`
}

// InAuthorization reports whether the request carried an Authorization: Bearer
// credential (the scheme is case-insensitive, RFC 9110 §11.1).
func InAuthorization(r *http.Request) bool {
	for _, v := range r.Header.Values("Authorization") {
		scheme, _, _ := strings.Cut(strings.TrimSpace(v), " ")
		if strings.EqualFold(scheme, "Bearer") {
			return true
		}
	}
	return false
}
