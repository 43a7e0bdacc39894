package contract

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/getkin/kin-openapi/openapi3filter"
)

// ValidateResponse checks a received response against the operation's declared
// responses; tests call it on every response they receive. It restores resp.Body.
func (o *Op) ValidateResponse(ctx context.Context, req *http.Request, pathParams map[string]string, resp *http.Response) error {
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: pathParams, Route: o.route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status: resp.StatusCode,
		Header: resp.Header,
		Body:   io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true, // an undeclared status is a contract violation
			MultiError:            true,
		},
	}
	if err := openapi3filter.ValidateResponse(ctx, in); err != nil {
		return fmt.Errorf("%s %s -> %d does not match the contract: %w\nbody: %s", o.Method, o.Path, resp.StatusCode, err, truncate(string(body), 2000))
	}
	return nil
}
