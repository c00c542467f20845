package service_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/testing/testcert"
)

// serveLine answers each connection of ln with one line, until ln closes,
// so that a test can tell a served connection from a refused one.
func serveLine(t *testing.T, ln net.Listener) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hello\n")
			c.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
}

// readLine reads the one line serveLine answers.
func readLine(t *testing.T, c net.Conn) string {
	t.Helper()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return line
}

// Without a certificate, Listen serves plain TCP and says http.
func TestListenPlain(t *testing.T) {
	t.Parallel()
	ln, scheme, err := service.Listen("127.0.0.1:0", "", "", "RECEIPTS")
	if err != nil {
		t.Fatal(err)
	}
	serveLine(t, ln)
	if scheme != "http" {
		t.Errorf("scheme %q, want http", scheme)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if got := readLine(t, c); got != "hello\n" {
		t.Errorf("read %q over plain TCP", got)
	}
}

// With a certificate and its key, Listen serves TLS with them and says
// https: a client that trusts the certificate reads the answer, and one
// that offers only TLS 1.1 is refused.
func TestListenTLS(t *testing.T) {
	t.Parallel()
	cert, key, pool := testcert.SelfSigned(t, t.TempDir())
	ln, scheme, err := service.Listen("127.0.0.1:0", cert, key, "CONSOLE")
	if err != nil {
		t.Fatal(err)
	}
	serveLine(t, ln)
	if scheme != "https" {
		t.Errorf("scheme %q, want https", scheme)
	}
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	if got := readLine(t, c); got != "hello\n" {
		t.Errorf("read %q over TLS", got)
	}
	old, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11})
	if err == nil {
		old.Close()
		t.Error("a TLS 1.1 client was served; want TLS 1.2 or later only")
	}
}

// An address that cannot be listened on, and a certificate that cannot be
// loaded, are errors naming the settings to fix, and leave nothing
// listening.
func TestListenErrorsNameTheSettings(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if _, _, err := service.Listen(taken.Addr().String(), "", "", "RECEIPTS"); err == nil || !strings.HasPrefix(err.Error(), "RECEIPTS_ADDR: ") {
		t.Errorf("listen on a taken address: %v, want an error naming RECEIPTS_ADDR", err)
	}

	_, key, _ := testcert.SelfSigned(t, t.TempDir())
	bad := filepath.Join(t.TempDir(), "cert.pem")
	if err := os.WriteFile(bad, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	for _, files := range [][2]string{{bad, key}, {filepath.Join(t.TempDir(), "missing.pem"), key}} {
		ln, _, err := service.Listen(addr, files[0], files[1], "CONSOLE")
		if err == nil {
			ln.Close()
			t.Fatalf("cert %s: listened, want an error", files[0])
		}
		if !strings.HasPrefix(err.Error(), "CONSOLE_TLS_CERT/CONSOLE_TLS_KEY: ") {
			t.Errorf("cert %s: %v, want an error naming CONSOLE_TLS_CERT/CONSOLE_TLS_KEY", files[0], err)
		}
		// The listener was closed with the error: the address is free.
		again, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("after the error, %s is still taken: %v", addr, err)
			continue
		}
		again.Close()
	}
}
