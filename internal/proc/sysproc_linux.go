package proc

import "syscall"

// sysProcAttr kills the child if the parent dies, and gives it a process
// group of its own when group is set.
func sysProcAttr(group bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: group, Pdeathsig: syscall.SIGKILL}
}
