// Package tty holds the little terminal handling the CLI needs (is it a terminal, read a
// password without echo, raw mode, window size) on golang.org/x/sys/unix.
package tty

import (
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// IsTerminal reports whether fd is a terminal.
func IsTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// ReadPassword reads one line from the terminal fd with echo off.
func ReadPassword(fd int) (string, error) {
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return "", err
	}
	noEcho := *old
	noEcho.Lflag &^= unix.ECHO
	noEcho.Lflag |= unix.ICANON | unix.ISIG
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &noEcho); err != nil {
		return "", err
	}
	defer unix.IoctlSetTermios(fd, unix.TCSETS, old)
	return readLine(os.NewFile(uintptr(fd), "tty"))
}

// ReadLine reads one line (without its newline).
func ReadLine(r io.Reader) (string, error) { return readLine(r) }

func readLine(r io.Reader) (string, error) {
	// Byte by byte, so nothing after the line is consumed from a shared stdin.
	var b strings.Builder
	buf := make([]byte, 1)
	for {
		n, err := r.Read(buf)
		if n == 1 {
			if buf[0] == '\n' {
				return strings.TrimSuffix(b.String(), "\r"), nil
			}
			b.WriteByte(buf[0])
		}
		if err != nil {
			if err == io.EOF && b.Len() > 0 {
				return b.String(), nil
			}
			return b.String(), err
		}
	}
}

// State is a terminal's saved mode.
type State struct {
	fd  int
	old unix.Termios
}

// MakeRaw puts fd in raw mode (as cfmakeraw) and returns what Restore puts back.
func MakeRaw(fd int) (*State, error) {
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN] = 1
	raw.Cc[unix.VTIME] = 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, err
	}
	return &State{fd: fd, old: *old}, nil
}

// Restore puts the saved mode back.
func (s *State) Restore() error { return unix.IoctlSetTermios(s.fd, unix.TCSETS, &s.old) }

// Size returns the terminal's columns and rows.
func Size(fd int) (cols, rows int, err error) {
	ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
	if err != nil {
		return 0, 0, err
	}
	return int(ws.Col), int(ws.Row), nil
}
