// Package openapi embeds the REST contract, proto/openapi/openapi.yaml, the source of truth
// for every HTTP operation of the control plane. Serve it (GET /api/v1/openapi.yaml),
// validate requests and responses against it (kin-openapi), and derive operation metadata
// from it.
package openapi

import (
	"context"
	_ "embed"
	"fmt"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
)

// Document is the OpenAPI 3.0.3 document, byte for byte as committed.
//
//go:embed openapi.yaml
var Document []byte

var formatsOnce sync.Once

// RegisterFormats teaches kin-openapi the string formats the contract relies on:
// `uuid` accepting every RFC 9562 version (ids are UUIDv7; kin-openapi's predefined RFC 4122
// pattern only knows v1-v5). kin-openapi keeps formats in a package-level table, so this
// affects the whole process; it is idempotent. Load calls it.
func RegisterFormats() {
	formatsOnce.Do(func() {
		openapi3.DefineStringFormatValidator("uuid", openapi3.NewRegexpFormatValidator(openapi3.FormatOfStringForUUIDOfRFC9562))
	})
}

// Load parses and validates Document and registers the contract's formats. Each call
// returns a fresh *openapi3.T.
func Load(ctx context.Context) (*openapi3.T, error) {
	RegisterFormats()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(Document)
	if err != nil {
		return nil, fmt.Errorf("openapi: load contract: %w", err)
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("openapi: invalid contract: %w", err)
	}
	return doc, nil
}
