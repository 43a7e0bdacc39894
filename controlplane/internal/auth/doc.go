// Package auth owns who may call the control plane: the RS256 signing keys of access
// tokens (created, rotated and published as a JWKS; private halves encrypted at rest
// under the master key), access-token issuance and verification, argon2id passwords,
// rotating single-use refresh tokens with reuse detection, and the auth endpoints of the
// contract (sign-up, login, refresh, logout, JWKS, internal JWKS refresh).
//
// Authentication puts a principal.Principal on the request; everything a handler needs
// to know about the caller travels in the token, so verifying a request never touches
// the database. Authorization (what the principal may do) belongs to the features.
//
// It must never log, audit, store or return a secret in plain form: passwords,
// refresh tokens and private keys are hashed or encrypted before they leave memory, and
// a token is read only from the Authorization header, never from a query string.
package auth
