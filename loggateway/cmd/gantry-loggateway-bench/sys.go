package main

import (
	"crypto/rand"
	"os"
	"os/signal"
	"syscall"
)

func notify(c chan os.Signal) { signal.Notify(c, os.Interrupt, syscall.SIGTERM) }

// cryptoRand reads the token secret from crypto/rand.
type cryptoRand struct{}

func (cryptoRand) Read(p []byte) (int, error) { return rand.Read(p) }
