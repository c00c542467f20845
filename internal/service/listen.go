package service

import (
	"crypto/tls"
	"fmt"
	"net"
)

// Listen listens on addr for a command's HTTP endpoint (the receiver's
// receipts, the relay's console) and returns the listener with the scheme
// to announce: https when certFile is set, its connections then served
// with certFile and keyFile (TLS 1.2 or later), http otherwise. The
// command's settings check that the two files come together; this only
// loads them. prefix names the command's settings in an error: PREFIX_ADDR
// when the address cannot be listened on, PREFIX_TLS_CERT/PREFIX_TLS_KEY
// when the pair cannot be loaded, so that the operator knows which to fix.
func Listen(addr, certFile, keyFile, prefix string) (ln net.Listener, scheme string, err error) {
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("%s_ADDR: %w", prefix, err)
	}
	if certFile == "" {
		return ln, "http", nil
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		ln.Close()
		return nil, "", fmt.Errorf("%s_TLS_CERT/%s_TLS_KEY: %w", prefix, prefix, err)
	}
	return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), "https", nil
}
