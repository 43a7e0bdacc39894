// Package redact decides which JSON fields hold secrets and strips them, for the places
// that persist or publish data a client or node sent or received (idempotency replay
// bodies, event payloads, logs). It is deliberately broad: a false positive costs a
// redacted field, a false negative leaks a credential.
package redact

import (
	"encoding/json"
	"strings"
)

// Placeholder replaces a secret value.
const Placeholder = "[redacted]"

// markers are substrings of field names that mark a secret.
var markers = []string{
	"token", "secret", "password", "passphrase", "private_key", "privatekey",
	"authorization", "credential", "api_key", "apikey", "cookie", "session_key", "totp",
}

// IsSecretField reports whether a JSON field name looks like it holds a secret.
func IsSecretField(name string) bool {
	n := strings.ToLower(name)
	for _, m := range markers {
		if strings.Contains(n, m) {
			return true
		}
	}
	return false
}

// FirstSecretField returns the first secret-like field name found anywhere in v (a value
// decoded from JSON, or built of maps and slices).
func FirstSecretField(v any) (string, bool) {
	switch t := v.(type) {
	case map[string]any:
		for k, inner := range t {
			if IsSecretField(k) {
				return k, true
			}
			if key, ok := FirstSecretField(inner); ok {
				return key, true
			}
		}
	case []any:
		for _, inner := range t {
			if key, ok := FirstSecretField(inner); ok {
				return key, true
			}
		}
	}
	return "", false
}

// JSON returns body with every secret-like field's value replaced by Placeholder.
// ok is false when body is not a JSON document.
func JSON(body []byte) (out []byte, ok bool) {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, false
	}
	out, err := json.Marshal(scrub(v))
	if err != nil {
		return nil, false
	}
	return out, true
}

func scrub(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, inner := range t {
			if IsSecretField(k) {
				t[k] = Placeholder
			} else {
				t[k] = scrub(inner)
			}
		}
	case []any:
		for i, inner := range t {
			t[i] = scrub(inner)
		}
	}
	return v
}
