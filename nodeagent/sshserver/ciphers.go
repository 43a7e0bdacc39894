package sshserver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"time"

	"golang.org/x/crypto/ssh"
)

// The cipher of the agent's own SSH server.
//
// In SSH the client's order picks the cipher: the first of the client's list that the
// server also offers. OpenSSH's list starts with chacha20-poly1305@openssh.com, and
// x/crypto/ssh implements that cipher with the pure-Go ChaCha20 on amd64 (no assembly;
// its AEAD package has some, but the SSH variant keys ChaCha20 itself): about 270 MB/s
// against 2.4 GB/s for AES-128-GCM with AES-NI, on the bench machine. It was the
// largest single cost of an scp through the tunnel, and made it 0.45x of scp to a local
// OpenSSH sshd (whose ChaCha20 is OpenSSL's vectorised one). The server therefore offers
// only AES-GCM to a client that can speak it, so the client's first choice that
// remains is AES-GCM. A client without AES-GCM (paramiko, older libssh2) gets the
// library's full default list, as before: its cipher is read from its KEXINIT, which
// the client sends in the clear before the server must commit to its own.

// gcmCiphers are offered alone to a client that offers one of them in both directions.
var gcmCiphers = []string{ssh.CipherAES128GCM, ssh.CipherAES256GCM}

// kexInitWait is how long the server waits for the client's KEXINIT before it offers its
// default list anyway. RFC 4253 has both sides send KEXINIT without waiting for the
// other's, and OpenSSH, PuTTY and x/crypto/ssh do; a client that waited for the
// server's first would otherwise sit out the handshake timeout.
const kexInitWait = 2 * time.Second

// maxKexInit bounds the client's first packet (x/crypto/ssh's own packet limit).
const maxKexInit = 256 << 10

// msgKexInit is SSH_MSG_KEXINIT.
const msgKexInit = 20

// peekClientCiphers sends the server's version line on c, reads the client's version
// line and its KEXINIT packet, and returns the client's cipher lists (client to server,
// server to client) together with a connection that gives x/crypto/ssh exactly the byte
// stream it would have seen: what was read is read again, and the server's version line,
// which NewServerConn writes first, is not sent twice. Lists are nil when the client's
// first bytes are not a well-formed KEXINIT (x/crypto/ssh then reports the failure
// itself) or do not come within kexInitWait. Only an I/O error of c is returned as an
// error.
func peekClientCiphers(c net.Conn, serverVersion string) (conn net.Conn, c2s, s2c []string, err error) {
	line := []byte(serverVersion + "\r\n")
	if _, err := c.Write(line); err != nil {
		return nil, nil, nil, err
	}
	// The caller sets the handshake's deadline again afterwards.
	_ = c.SetReadDeadline(time.Now().Add(kexInitWait))
	var got []byte
	buf := make([]byte, 4096)
	var waited bool
	fill := func() error {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if n > 0 {
			return nil
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			waited = true
		}
		return err
	}
	done := func(c2s, s2c []string) (net.Conn, []string, []string, error) {
		return &replayConn{Conn: c, pending: got, sent: line}, c2s, s2c, nil
	}
	fail := func(err error) (net.Conn, []string, []string, error) {
		if waited {
			return done(nil, nil)
		}
		return nil, nil, nil, err
	}
	// The client's version line; x/crypto/ssh allows a few other lines before it, so
	// skip whole lines until one starts with "SSH-".
	off := 0
	for {
		i := bytes.IndexByte(got[off:], '\n')
		if i < 0 {
			if len(got) > 4096 {
				return done(nil, nil)
			}
			if err := fill(); err != nil {
				return fail(err)
			}
			continue
		}
		isVersion := bytes.HasPrefix(got[off:], []byte("SSH-"))
		off += i + 1
		if isVersion {
			break
		}
	}
	// The KEXINIT packet: uint32 length, byte padding length, payload, padding.
	for len(got)-off < 4 {
		if err := fill(); err != nil {
			return fail(err)
		}
	}
	plen := int(binary.BigEndian.Uint32(got[off:]))
	if plen < 1 || plen > maxKexInit {
		return done(nil, nil)
	}
	for len(got)-off < 4+plen {
		if err := fill(); err != nil {
			return fail(err)
		}
	}
	pkt := got[off+4 : off+4+plen]
	pad := int(pkt[0])
	if pad+1 > len(pkt) {
		return done(nil, nil)
	}
	c2s, s2c, ok := kexInitCiphers(pkt[1 : len(pkt)-pad])
	if !ok {
		return done(nil, nil)
	}
	return done(c2s, s2c)
}

// kexInitCiphers reads the two cipher name-lists of a KEXINIT payload: after the
// message number and the 16-byte cookie come the name-lists of key exchange, host key,
// then the ciphers client to server and server to client.
func kexInitCiphers(p []byte) (c2s, s2c []string, ok bool) {
	if len(p) < 17 || p[0] != msgKexInit {
		return nil, nil, false
	}
	p = p[17:]
	var lists [4][]string
	for i := range lists {
		if len(p) < 4 {
			return nil, nil, false
		}
		n := int(binary.BigEndian.Uint32(p))
		if n > len(p)-4 {
			return nil, nil, false
		}
		if n > 0 {
			lists[i] = splitNames(p[4 : 4+n])
		}
		p = p[4+n:]
	}
	return lists[2], lists[3], true
}

func splitNames(b []byte) []string {
	var out []string
	for _, f := range bytes.Split(b, []byte(",")) {
		out = append(out, string(f))
	}
	return out
}

// serverCiphers is what the server offers a client that offered c2s and s2c: AES-GCM
// alone when the client speaks it both ways, else nil (x/crypto/ssh's defaults).
func serverCiphers(c2s, s2c []string) []string {
	speaks := func(list []string) bool {
		return slices.ContainsFunc(list, func(n string) bool { return slices.Contains(gcmCiphers, n) })
	}
	if speaks(c2s) && speaks(s2c) {
		return gcmCiphers
	}
	return nil
}

// replayConn is c after peekClientCiphers: reads return the peeked bytes first, and the
// first write, when it is the version line already sent, is swallowed.
type replayConn struct {
	net.Conn
	pending []byte
	sent    []byte
}

func (r *replayConn) Read(p []byte) (int, error) {
	if len(r.pending) > 0 {
		n := copy(p, r.pending)
		r.pending = r.pending[n:]
		return n, nil
	}
	return r.Conn.Read(p)
}

func (r *replayConn) Write(p []byte) (int, error) {
	if r.sent != nil {
		sent := r.sent
		r.sent = nil
		if bytes.Equal(p, sent) {
			return len(p), nil
		}
		return 0, errors.New("sshserver: unexpected first write " + string(bytes.TrimSpace(p)))
	}
	return r.Conn.Write(p)
}
