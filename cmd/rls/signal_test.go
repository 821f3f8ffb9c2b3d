package main

import "syscall"

// syscallKill sends SIGHUP to pid.
func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGHUP) }
