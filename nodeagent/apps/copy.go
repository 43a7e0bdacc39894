package apps

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// fromAppBuffer is the read size from the app's socket toward the fabric stream: the
// 32 KiB that io.Copy used. Larger reads were not cheaper: with 256 KiB reads (256 KiB
// yamux frames) the proxied 1 GiB download cost as much CPU or more (the fabric's
// BenchmarkStreamWrite: 32 KiB writes 1.29-1.66 CPU s/GiB, 256 KiB 1.40-1.84, load
// 15-17), the chunks no longer staying in the cores' caches between the copies.
const fromAppBuffer = 32 << 10

// fromAppBuffers are taken only while the app has bytes waiting (copyFromApp), so an
// idle stream (a WebSocket nobody talks on) holds none. io.Copy held its 32 KiB buffer
// for the stream's whole life, through every blocking read: 1,000 idle proxied
// WebSockets held 31 MiB of the agent's heap in them.
var fromAppBuffers = sync.Pool{New: func() any { b := make([]byte, fromAppBuffer); return &b }}

// fromAppBuffersOut counts the buffers taken and not yet given back (tests).
var fromAppBuffersOut atomic.Int64

func takeFromAppBuffer() *[]byte {
	fromAppBuffersOut.Add(1)
	return fromAppBuffers.Get().(*[]byte)
}

func giveFromAppBuffer(bp *[]byte) {
	fromAppBuffersOut.Add(-1)
	fromAppBuffers.Put(bp)
}

// copyFromApp copies what the app sends on src to dst until src ends (nil) or either side
// fails. It waits for src to become readable without a buffer, through the connection's
// raw file descriptor, and only then takes one from the pool.
func copyFromApp(dst io.Writer, src *net.TCPConn) error {
	rc, err := src.SyscallConn()
	if err != nil {
		return err
	}
	for {
		var bp *[]byte
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			bp = takeFromAppBuffer()
			for {
				n, rerr = syscall.Read(int(fd), *bp)
				if !errors.Is(rerr, syscall.EINTR) {
					break
				}
			}
			if errors.Is(rerr, syscall.EAGAIN) {
				giveFromAppBuffer(bp)
				bp = nil
				return false // wait until readable, holding nothing
			}
			return true
		})
		if err == nil {
			err = rerr
		}
		if bp == nil {
			return err
		}
		if n > 0 {
			_, werr := dst.Write((*bp)[:n])
			giveFromAppBuffer(bp)
			if werr != nil {
				return werr
			}
			continue
		}
		giveFromAppBuffer(bp)
		if err != nil {
			return err
		}
		return nil // n == 0: the app closed its sending side
	}
}
