// Package api is generated from the REST contract proto/openapi/openapi.yaml by oapi-codegen:
// models, the chi strict-server interface (StrictServerInterface) and the client.
// spec_sha256.go records the SHA-256 of the openapi.yaml it was generated from, so a test
// can tell when the contract changed without `make generate`.
package api

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config oapi-codegen.yaml ../openapi/openapi.yaml
//go:generate go run ./internal/spechash ../openapi/openapi.yaml spec_sha256.go
