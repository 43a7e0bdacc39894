package contract

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// ValidateRequest checks parameters and body (not a streamed one) against the operation. Security is checked
// by the chain itself, not here. A failure is validation_error naming the field.
func (o *Op) ValidateRequest(ctx context.Context, r *http.Request, pathParams map[string]string) error {
	if !o.needsValidation(r) {
		return nil
	}
	if o.Streams {
		// kin-openapi's security check reads the whole body into memory (it hands it to
		// each AuthenticationFunc), even with ExcludeRequestBody: a streamed body must
		// never reach it.
		shallow := *r
		shallow.Body = http.NoBody
		r = &shallow
	}
	in := &openapi3filter.RequestValidationInput{
		Request:    r,
		PathParams: pathParams,
		Route:      o.route,
		Options: &openapi3filter.Options{
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			// Defaults are applied by the generated server, never by the validator.
			SkipSettingDefaults: true,
			// A streamed body is the handler's to read as it arrives (Op.Streams).
			ExcludeRequestBody: o.Streams,
		},
	}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
		return requestError(err)
	}
	return nil
}

// requestError turns a kin-openapi error into our envelope, naming the field.
func requestError(err error) error {
	// A body that is not JSON at all is a malformed request (400); a body that breaks
	// the schema is a validation error (422).
	var (
		parse *openapi3filter.ParseError
		body  *openapi3filter.RequestError
	)
	if errors.As(err, &body) && body.RequestBody != nil && errors.As(err, &parse) {
		return apierr.New(apierr.InvalidRequest, "request body is not valid JSON").With("field", "body").Wrap(err)
	}
	var reqErr *openapi3filter.RequestError
	if errors.As(err, &reqErr) {
		field, reason := "", ""
		if reqErr.Parameter != nil {
			field = reqErr.Parameter.Name
		}
		var schemaErr *openapi3.SchemaError
		if errors.As(reqErr.Err, &schemaErr) {
			if ptr := schemaErr.JSONPointer(); len(ptr) > 0 {
				path := strings.Join(ptr, ".")
				if field == "" {
					field = path
				} else {
					field += "." + path
				}
			}
			reason = schemaErr.Reason
			// additionalProperties false names the unknown property in the reason.
			if name, ok := unsupportedProperty(schemaErr.Reason); ok {
				if field != "" {
					field += "." + name
				} else {
					field = name
				}
				reason = "unknown field"
			}
		} else if reqErr.Err != nil {
			reason = reqErr.Err.Error()
		} else {
			reason = reqErr.Reason
		}
		if field == "" && reqErr.RequestBody != nil {
			field = "body"
		}
		if field == "" {
			field = "request"
		}
		msg := fmt.Sprintf("%s: %s", field, reason)
		if reason == "" {
			msg = fmt.Sprintf("%s is not valid", field)
		}
		return apierr.New(apierr.ValidationError, "%s", truncate(msg, 300)).With("field", field)
	}
	return apierr.New(apierr.ValidationError, "request does not match the contract").Wrap(err)
}

// unsupportedProperty extracts the name from kin-openapi's `property "x" is unsupported`.
func unsupportedProperty(reason string) (string, bool) {
	const pre, post = `property "`, `" is unsupported`
	i := strings.Index(reason, pre)
	j := strings.LastIndex(reason, post)
	if i < 0 || j <= i+len(pre) {
		return "", false
	}
	return reason[i+len(pre) : j], true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
