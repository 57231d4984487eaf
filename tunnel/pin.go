package tunnel

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
)

// CertPin is the pin of cert's public key: "sha256/" and the standard
// base64 of the SHA-256 of its SubjectPublicKeyInfo (the form HPKP used),
// so a renewed certificate with the same key keeps its pin. Clients of the
// direct data path verify the coordinator's listener against it
// (protocol.DirectStreamReply.Pin).
func CertPin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256/" + base64.StdEncoding.EncodeToString(sum[:])
}
