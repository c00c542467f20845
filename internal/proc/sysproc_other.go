//go:build !linux

package proc

import "syscall"

// sysProcAttr gives the child a process group of its own when group is set.
func sysProcAttr(group bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: group}
}
