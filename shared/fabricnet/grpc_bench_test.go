package fabricnet_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"google.golang.org/grpc"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// memRead serves StorageFabric.Read from memory: Length bytes in 1 MiB chunks.
type memRead struct {
	fabricv1.UnimplementedStorageFabricServer
}

func (memRead) Read(r *fabricv1.StorageReadRequest, st fabricv1.StorageFabric_ReadServer) error {
	chunk := make([]byte, 1<<20)
	for left := r.GetLength(); left > 0; left -= int64(len(chunk)) {
		if err := st.Send(&fabricv1.StorageReadChunk{Data: chunk[:min(left, int64(len(chunk)))]}); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkGRPCStreamRead is the storage read path's transport without storage: a
// server-streamed Read of 64 MiB over one tunnel, the gRPC server on the agent-opened
// streams as the control plane runs it (small shared buffers), the client GRPCClient.
func BenchmarkGRPCStreamRead(b *testing.B) {
	const size = 64 << 20
	srvTLS, cliTLS := certs(b)
	for _, m := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		for _, v := range []struct {
			bufs   int
			window int32
		}{{4 << 10, 0}, {32 << 10, 0}, {4 << 10, 8 << 20}} {
			bufs := v.bufs
			b.Run(fmt.Sprintf("%s/buffers-%dk/window-%dk", m, bufs>>10, v.window>>10), func(b *testing.B) {
				ln, err := fabricnet.Listen("127.0.0.1:0", srvTLS, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer ln.Close()
				sl := fabricnet.NewStreamListener(ln.Addr())
				srv := grpc.NewServer(grpc.ReadBufferSize(bufs), grpc.WriteBufferSize(bufs))
				fabricv1.RegisterStorageFabricServer(srv, memRead{})
				go func() { _ = srv.Serve(sl) }()
				defer srv.Stop()
				go func() {
					for {
						s, err := ln.Accept(context.Background())
						if err != nil {
							return
						}
						go func() {
							for {
								st, err := s.AcceptStream(context.Background())
								if err != nil {
									return
								}
								sl.Push(context.Background(), st)
							}
						}()
					}
				}()
				cli := cliTLS.Clone()
				cli.ServerName = "127.0.0.1"
				s, err := fabricnet.Dial(context.Background(), ln.Addr().String(), m, cli, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close("bench done")
				var opts []grpc.DialOption
				if v.window > 0 {
					opts = append(opts, grpc.WithInitialWindowSize(v.window), grpc.WithInitialConnWindowSize(2*v.window))
				}
				cc, err := fabricnet.GRPCClient(s, opts...)
				if err != nil {
					b.Fatal(err)
				}
				defer cc.Close()
				c := fabricv1.NewStorageFabricClient(cc)
				b.SetBytes(size)
				b.ResetTimer()
				for range b.N {
					st, err := c.Read(context.Background(), &fabricv1.StorageReadRequest{Length: size})
					if err != nil {
						b.Fatal(err)
					}
					var n int64
					for {
						m, err := st.Recv()
						if err == io.EOF {
							break
						}
						if err != nil {
							b.Fatal(err)
						}
						n += int64(len(m.GetData()))
					}
					if n != size {
						b.Fatalf("read %d", n)
					}
				}
			})
		}
	}
}
