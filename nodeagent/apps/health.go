package apps

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// checker runs one instance's health check.
type checker struct {
	kind      string
	path      string
	interval  time.Duration
	timeout   time.Duration
	threshold int
	client    *http.Client
}

func newChecker(spec *fabricv1.AppStartTask) *checker {
	hc := spec.GetHealthCheck()
	c := &checker{kind: apptask.HealthTCP, interval: apptask.DefaultHealthInterval, timeout: apptask.DefaultHealthTimeout, threshold: apptask.DefaultFailureThreshold}
	if hc.GetType() == apptask.HealthHTTP {
		c.kind, c.path = apptask.HealthHTTP, hc.GetHttpPath()
	}
	if d := hc.GetInterval().AsDuration(); d > 0 {
		c.interval = d
	}
	if d := hc.GetTimeout().AsDuration(); d > 0 {
		c.timeout = d
	}
	if n := hc.GetFailureThreshold(); n > 0 {
		c.threshold = int(n)
	}
	if c.kind == apptask.HealthHTTP {
		c.client = &http.Client{
			Timeout:   c.timeout,
			Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
			// A redirect (Jupyter's / → /tree) is an answer: the app serves.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return c
}

// check is nil when the app answers on port.
func (c *checker) check(ctx context.Context, port int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if c.kind == apptask.HealthTCP {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+c.path, nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: status %d", c.path, resp.StatusCode)
	}
	return nil
}
