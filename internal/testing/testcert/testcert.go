// Package testcert makes the X.509 certificates of tests that need TLS: a
// CA and the certificates it issues, or one self-signed certificate, as
// PEM files that the code under test loads the way it loads a deployment's.
//
// Every key is ECDSA P-256 (quick to make, and what a deployment would
// use), every file is written with mode 0600 (some loaders, Postgres's
// among them, refuse a key that others may read), and every certificate is valid from an hour ago,
// so that a clock a little behind does not reject it, to a day ahead, longer
// than any test runs.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority of a test's own, which nothing outside
// the test trusts.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is Cert encoded as a PEM block, what a CA file holds.
	PEM []byte
}

// NewCA makes a CA whose subject's common name is name. Give a test's
// CAs different names, so that a failed verification names the one it
// expected.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcert: CA %q: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcert: CA %q: %v", name, err)
	}
	return &CA{Cert: cert, Key: key, PEM: encode("CERTIFICATE", der)}
}

// WriteFile writes the CA's certificate to dir/ca.pem and returns the
// file's path. It fails the test if the file is there already: two CAs
// written to one directory would otherwise leave the test trusting
// whichever came last.
func (ca *CA) WriteFile(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ca.pem")
	writeFile(t, path, ca.PEM)
	return path
}

// Pool returns a pool that trusts the CA and nothing else.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// Issue writes a certificate signed by the CA, for 127.0.0.1 and
// localhost with name as its common name, to dir/name-cert.pem and its
// key to dir/name-key.pem, and returns the two paths. The certificate is
// good for the usages given: x509.ExtKeyUsageServerAuth for a server's,
// x509.ExtKeyUsageClientAuth for a client's. With none it is good for
// both ends of a connection, as a NATS route's must be; it is never left
// without an extended key usage, which Go would read as any usage at all.
func (ca *CA) Issue(t testing.TB, dir, name string, usages ...x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	if len(usages) == 0 {
		usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages,
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatalf("testcert: certificate %q: %v", name, err)
	}
	certFile, keyFile = filepath.Join(dir, name+"-cert.pem"), filepath.Join(dir, name+"-key.pem")
	writeFile(t, certFile, encode("CERTIFICATE", der))
	writeFile(t, keyFile, encodeKey(t, key))
	return certFile, keyFile
}

// SelfSigned writes a self-signed server certificate for 127.0.0.1 to
// dir/cert.pem and its key to dir/key.pem, and returns the two paths and
// a pool that trusts the certificate and nothing else. It suits a server
// whose clients are the test's alone; when a test needs a CA file, or
// client certificates, NewCA and Issue make them.
func SelfSigned(t testing.TB, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: "testcert self-signed"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcert: self-signed certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcert: self-signed certificate: %v", err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeFile(t, certFile, encode("CERTIFICATE", der))
	writeFile(t, keyFile, encodeKey(t, key))
	return certFile, keyFile, pool
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcert: key: %v", err)
	}
	return key
}

// serial is random, as RFC 5280 asks of a CA, so that no two certificates
// of one issuer share a serial number even when a test makes many.
func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("testcert: serial number: %v", err)
	}
	return n
}

func encode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// encodeKey writes the key in SEC 1 form ("EC PRIVATE KEY"), which every
// loader the tests use (crypto/tls, the NATS server, nats.go) reads.
func encodeKey(t testing.TB, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("testcert: key: %v", err)
	}
	return encode("EC PRIVATE KEY", der)
}

// writeFile creates path with mode 0600 and fails the test if it exists,
// so that a second certificate of the same name cannot silently replace
// the first.
func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatalf("testcert: %v", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		t.Fatalf("testcert: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("testcert: %v", err)
	}
}
