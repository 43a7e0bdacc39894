// Package fabricnet is the transport of the node fabric, shared by the control plane's
// fabric server and the node agent: one multiplexed, TLS-protected tunnel per node,
// dialled by the agent.
//
// A tunnel is QUIC (ALPN "gantry-fabric/1") or, where UDP is blocked, TLS over TCP with
// yamux on the same port number. Both give a Session with OpenStream / AcceptStream
// returning net.Conn streams, so nothing above this package cares which one it is.
//
// What runs on a tunnel (proto/fabric/v1/fabric.proto says it in full):
//
//   - The agent's first stream authenticates the node token: Authenticate (agent) writes
//     an AuthRequest frame and reads the AuthResponse.
//   - Further streams the agent opens carry gRPC: GRPCClient turns a Session into a
//     grpc.ClientConn for fabricv1.FabricClient; the server feeds accepted streams to a
//     grpc.Server through a StreamListener. Or they are raw streams for bulk bytes
//     (OpenAgentStream: a four-byte AgentStreamKind starting with 0x00, which no HTTP/2
//     preface does, then a request frame); the server tells them apart with
//     PeekAgentStream.
//   - Streams the control plane opens are raw byte streams that begin with a
//     StreamPreamble frame (OpenRaw on the server; ReadPreamble / WriteReply on the
//     agent). quic-go only shows a new stream to the peer once a byte is written: the
//     preamble is that byte.
//   - Beside a QUIC tunnel the agent may hold a bulk side session (DialBulkSide, a
//     TLS+TCP tunnel authenticated with AuthRequest.bulk_for_session_id) that carries
//     only its raw streams: quic-go costs about 2.4 times the CPU per byte of TLS+TCP.
//   - Where the control plane takes them (AuthResponse.bulk_connections), the agent
//     carries each raw stream on a bulk connection of its own instead (DialBulkConn,
//     BulkConns: TLS+TCP with the ALPN ALPNBulk, authenticated the same way, one raw
//     stream straight over TLS with no yamux), on either transport.
//
// A minimal agent loop (error handling left out; see example_test.go):
//
//	sess, _ := fabricnet.Dial(ctx, "cp.example:7443", fabricnet.ModeAuto, tlsConf, nil)
//	res, _ := fabricnet.Authenticate(ctx, sess, &fabricv1.AuthRequest{Token: tok, ProtocolVersion: 1})
//	cc, _ := fabricnet.GRPCClient(sess)
//	ctl, _ := fabricv1.NewFabricClient(cc).Control(ctx)
//	_ = ctl.Send(&fabricv1.AgentMessage{Msg: &fabricv1.AgentMessage_Hello{Hello: hello}})
//	welcome, _ := ctl.Recv() // then heartbeat every welcome.Heartbeat.Interval
//	go func() { for { s, err := sess.AcceptStream(ctx); ...; pre, _ := fabricnet.ReadPreamble(s); ... } }()
//
// This package never decides policy (who may connect, heartbeat TTLs): that is the
// fabric server's (controlplane/internal/fabric) and the agent's business.
package fabricnet
