// Package api is generated from the REST contract proto/openapi/openapi.yaml by oapi-codegen:
// models, the chi strict-server interface (StrictServerInterface), the client and the embedded spec.
package api

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config oapi-codegen.yaml ../openapi/openapi.yaml
