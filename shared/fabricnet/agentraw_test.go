package fabricnet

import (
	"io"
	"net"
	"testing"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// TestPeekAgentStream: a stream that starts with gRPC's HTTP/2 preface comes back whole
// (the peeked byte replayed) and not raw; a raw stream comes back with its kind and
// positioned at its request frame.
func TestPeekAgentStream(t *testing.T) {
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	a, b := net.Pipe()
	go func() { _, _ = a.Write([]byte(preface)); _ = a.Close() }()
	conn, _, raw, err := PeekAgentStream(b)
	if err != nil || raw {
		t.Fatalf("gRPC stream: raw=%v err=%v", raw, err)
	}
	got, _ := io.ReadAll(conn)
	if string(got) != preface {
		t.Fatalf("replayed %q, want the preface", got)
	}

	a, b = net.Pipe()
	req := &fabricv1.StorageReadRequest{AttachmentId: "x", Path: "p", Offset: 7}
	go func() {
		buf := append([]byte(nil), AgentStreamStorageRead[:]...)
		_, _ = a.Write(append(buf, mustFrame(t, req)...))
	}()
	conn, kind, raw, err := PeekAgentStream(b)
	if err != nil || !raw || kind != AgentStreamStorageRead {
		t.Fatalf("raw stream: kind=%v raw=%v err=%v", kind, raw, err)
	}
	var got2 fabricv1.StorageReadRequest
	if err := ReadFrame(conn, &got2); err != nil || got2.GetOffset() != 7 || got2.GetPath() != "p" {
		t.Fatalf("request frame: %v %v", &got2, err)
	}
	_ = a.Close()
}

func mustFrame(t *testing.T, m *fabricv1.StorageReadRequest) []byte {
	t.Helper()
	var w frameBuf
	if err := WriteFrame(&w, m); err != nil {
		t.Fatal(err)
	}
	return w.b
}

type frameBuf struct{ b []byte }

func (f *frameBuf) Write(p []byte) (int, error) { f.b = append(f.b, p...); return len(p), nil }
