package main

import "runtime"

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// runtimeCPUs is the number of CPUs this machine has.
func runtimeCPUs() int { return runtime.NumCPU() }
