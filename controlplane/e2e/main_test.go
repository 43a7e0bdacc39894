package e2e_test

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// refusingProbeDialer answers every node probe at once with "connection refused": a node
// on a private address is created (and recorded unreachable) without waiting for the
// probe timeout or touching the network.
type refusingProbeDialer struct{}

func (refusingProbeDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("connection refused")
}
