package fabric_test

import (
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabrictest"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// A reconnecting agent resumes its TLS session (no certificate chain sent, signed or
// verified), after a cut and after the control plane restarted, since the ticket key is
// derived from the CA and not drawn per process. Both transports.
func TestReconnectResumesTLSSession(t *testing.T) {
	for _, mode := range []fabricnet.Mode{fabricnet.ModeQUIC, fabricnet.ModeTCP} {
		t.Run(string(mode), func(t *testing.T) {
			fx := newFixture(t)
			cfg := fx.config("a")
			srv, stop := fx.server(cfg)
			_, tok := fx.node()
			a, _ := fx.agent(srv, tok, mode)
			c1 := waitConn(t, a)
			if c1.Session.TLS().DidResume {
				t.Fatal("the first tunnel resumed a session it never had")
			}
			_ = c1.Session.Close("cut")
			c2 := waitConn(t, a)
			if !c2.Session.TLS().DidResume {
				t.Fatal("the tunnel after a cut did a full handshake")
			}

			// A restarted control plane (a new process would derive the same key: the
			// fixture's second server loads the same CA from the database).
			cfg.Addr = srv.ListenAddr().String()
			stop()
			srv2, _ := fx.server(cfg)
			c3 := waitConn(t, a)
			if !c3.Session.TLS().DidResume {
				t.Fatal("the tunnel to the restarted control plane did a full handshake")
			}
			if got := c3.Transport; got != fabricnet.Transport(mode) {
				t.Fatalf("transport %s", got)
			}

			// An agent without a session cache shakes hands in full every time: what the
			// checks above see is the agent's cache, not something of the fixture.
			_, tok2 := fx.node()
			b, _ := fx.agent(srv2, tok2, mode, func(a *fabrictest.Agent) { a.NoResumption = true })
			_ = waitConn(t, b).Session.Close("cut")
			if waitConn(t, b).Session.TLS().DidResume {
				t.Fatal("an agent without a session cache resumed")
			}
		})
	}
}
