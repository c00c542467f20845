package proc

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Command is a program's main without the process globals: it runs until
// ctx ends and returns the exit status. Tests call it directly.
type Command func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int

// Main runs cmd as this process: its context ends at SIGINT or SIGTERM
// (a second signal then kills the process as usual), and the process exits
// with its status.
func Main(cmd Command) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := cmd(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
