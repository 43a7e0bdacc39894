// Package sshkeys owns users' SSH public keys: parsing and validating an authorized_keys
// line, fingerprinting it, storing it once per user, and resolving the keys an
// allocation will install. It never sees or stores a private key, and it stores only the
// normalised key (algorithm and base64 blob), never authorized_keys options.
//
// Accepted: ssh-ed25519, ecdsa-sha2-nistp256/384/521, ssh-rsa of at least 2048 bits,
// and the security-key variants sk-ssh-ed25519@openssh.com and
// sk-ecdsa-sha2-nistp256@openssh.com. Refused, as 422 validation_error with
// details.field public_key and details.reason: invalid_key (not an OpenSSH public key,
// or more than one), options_not_allowed (authorized_keys options), unsupported_key_type
// (DSA, certificates, anything else), weak_key (RSA below 2048 bits).
//
// Error codes where the contract has no dedicated code (seed §7.2):
//   - A key whose fingerprint the caller already has is 409 invalid_request with
//     details {field: public_key, reason: duplicate_key} (the contract describes it as 409).
//   - Deleting a key that does not exist or is another user's is 404 invalid_request with
//     details.reason not_found: the two are indistinguishable on purpose.
//   - Resolve (allocation create) refuses with 422 validation_error, field ssh_key_ids:
//     reason ssh_key_not_found when an explicit id is not the user's, reason no_ssh_key
//     when the user has no key at all; both wrap ErrNoResolvableKey.
package sshkeys
