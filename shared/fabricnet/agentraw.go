package fabricnet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/protobuf/proto"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// Agent-opened raw streams. Every stream the agent opens used to carry gRPC (HTTP/2),
// which costs bulk transfers dearly: each byte of a storage read was copied into a
// protobuf message, an HTTP/2 data frame and gRPC's write buffer on the control plane,
// and out of them again on the agent (about a quarter of an attachment read's CPU,
// docs/storage.md). A raw stream starts with a four-byte AgentStreamKind instead of
// the HTTP/2 client preface ("PRI * HTTP/2.0..."), then one request frame; the
// control plane answers with a StreamReply frame and, when ok, whatever the kind
// defines, as plain bytes. The first byte tells them apart: every kind starts with
// 0x00, which no HTTP/2 preface does.

// AgentStreamKind is the first four bytes of an agent-opened raw stream.
type AgentStreamKind [4]byte

// AgentStreamStorageRead is StorageFabric.Read without gRPC: the request frame is a
// StorageReadRequest; the answer a StreamReply (error_code: the gRPC code's name, e.g.
// "PERMISSION_DENIED"), then, when ok, a StorageObjectInfo frame and exactly the range's
// bytes (the length the info's size implies for the request). The stream then takes the
// next request (AgentStreamRequest), until either side closes it: fewer bytes than
// promised mean the read failed. Reusing streams matters on TLS+yamux, whose receive
// buffer grows afresh on every new stream (about a fifth of a read's CPU with a new
// stream per 4 MiB block).
var AgentStreamStorageRead = AgentStreamKind{0, 'g', 's', 'r'}

// rawPeekTimeout bounds how long an agent-opened stream may take to send its first byte
// (gRPC sends its preface at once).
const rawPeekTimeout = 10 * time.Second

// OpenAgentStream opens a raw stream toward the control plane (agent side): kind and
// req go out in one write, then it waits for the StreamReply. A refusal is a
// *StreamRefusedError. A control plane that does not know raw streams hands the stream
// to its gRPC server, which closes it on the bad preface: the error is then a read
// error, not a refusal, and the caller falls back to gRPC.
func OpenAgentStream(ctx context.Context, s Session, kind AgentStreamKind, req proto.Message) (net.Conn, error) {
	st, err := s.OpenStream(ctx)
	if err != nil {
		return nil, err
	}
	if err := request(ctx, st, kind[:], req); err != nil {
		_ = st.Close()
		return nil, err
	}
	return st, nil
}

// AgentStreamRequest sends one more request on a raw stream whose kind serves several
// in turn (AgentStreamStorageRead: the next range, once the last one's bytes were all
// read) and waits for its StreamReply. Any error but a refusal leaves the stream
// unusable: close it.
func AgentStreamRequest(ctx context.Context, st net.Conn, req proto.Message) error {
	return request(ctx, st, nil, req)
}

func request(ctx context.Context, st net.Conn, prefix []byte, req proto.Message) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(dl)
	} else {
		_ = st.SetDeadline(time.Now().Add(30 * time.Second))
	}
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) error {
		stop()
		return err
	}
	b, err := proto.Marshal(req)
	if err != nil {
		return fail(err)
	}
	if len(b) > MaxFrameSize {
		return fail(ErrFrameTooLarge)
	}
	buf := protodelimAppend(append(make([]byte, 0, len(prefix)+len(b)+3), prefix...), b)
	if _, err := st.Write(buf); err != nil {
		return fail(fmt.Errorf("fabricnet: write raw stream request: %w", err))
	}
	var rep fabricv1.StreamReply
	if err := ReadFrame(st, &rep); err != nil {
		return fail(fmt.Errorf("fabricnet: read raw stream reply: %w", err))
	}
	if !rep.GetOk() {
		return fail(&StreamRefusedError{Code: rep.GetErrorCode(), Message: rep.GetMessage()})
	}
	if !stop() && ctx.Err() != nil {
		return ctx.Err()
	}
	_ = st.SetDeadline(time.Time{})
	return nil
}

// PeekAgentStream reads the first byte of an agent-opened stream (control-plane side).
// A gRPC stream (raw=false) comes back as a conn that replays what was read; a raw one
// comes back with its kind, positioned at the request frame. It waits at most
// rawPeekTimeout for the agent's first bytes.
func PeekAgentStream(st net.Conn) (conn net.Conn, kind AgentStreamKind, raw bool, err error) {
	_ = st.SetReadDeadline(time.Now().Add(rawPeekTimeout))
	defer func() { _ = st.SetReadDeadline(time.Time{}) }()
	var first [1]byte
	if _, err := io.ReadFull(st, first[:]); err != nil {
		return nil, kind, false, err
	}
	if first[0] != 0 {
		return &replayConn{Conn: st, head: bytes.NewReader(first[:])}, kind, false, nil
	}
	kind[0] = 0
	if _, err := io.ReadFull(st, kind[1:]); err != nil {
		return nil, kind, false, err
	}
	return st, kind, true, nil
}

// replayConn is a stream whose first bytes were read already: Read returns them first.
type replayConn struct {
	net.Conn
	head *bytes.Reader
}

func (c *replayConn) Read(p []byte) (int, error) {
	if c.head.Len() > 0 {
		return c.head.Read(p)
	}
	return c.Conn.Read(p)
}
