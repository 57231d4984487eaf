package sshgate

import (
	"net"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// FuzzParseKeyFile: the key file loader never panics, and what it accepts
// is what it says: every key parses back, no certificate, and an error
// means no keys (no keys without an error is a file without key lines).
func FuzzParseKeyFile(f *testing.F) {
	f.Add([]byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN9hvUAdych7n6Te3aMn6fexm3ETu3ySnx1D010IXrAo alice@example\n"), false)
	f.Add([]byte("cert-authority ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN9hvUAdych7n6Te3aMn6fexm3ETu3ySnx1D010IXrAo ca\n"), true)
	f.Add([]byte(`from="10.0.0.0/8",no-pty ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN9hvUAdych7n6Te3aMn6fexm3ETu3ySnx1D010IXrAo x`), false)
	f.Add([]byte("# only a comment\n\n\r\n"), false)
	f.Add([]byte("ssh-rsa AAAA\n"), true)
	f.Add([]byte("ssh-ed25519-cert-v01@openssh.com AAAAIHNzaC1lZDI1NTE5LWNlcnQtdjAxQG9wZW5zc2guY29tAAAAIEr+5OR0rqn3kRoSHstwi8k5lxTh1hJz8rjcBZ2wrfcuAAAAIN9hvUAdych7n6Te3aMn6fexm3ETu3ySnx1D010IXrAoAAAAAAAAAAAAAAABAAAABHRlc3QAAAAJAAAABWFsaWNlAAAAAAAAAAD//////////wAAAAAAAACCAAAAFXBlcm1pdC1YMTEtZm9yd2FyZGluZwAAAAAAAAAXcGVybWl0LWFnZW50LWZvcndhcmRpbmcAAAAAAAAAFnBlcm1pdC1wb3J0LWZvcndhcmRpbmcAAAAAAAAACnBlcm1pdC1wdHkAAAAAAAAADnBlcm1pdC11c2VyLXJjAAAAAAAAAAAAAAAzAAAAC3NzaC1lZDI1NTE5AAAAIN9hvUAdych7n6Te3aMn6fexm3ETu3ySnx1D010IXrAoAAAAUwAAAAtzc2gtZWQyNTUxOQAAAEDtbd0AyCPzL1r/e2hotbr8+2SdQTJ3gGMbaFp/uSGnZPPU4mXDHCvoGkz312P/dU40q6WpZDcuBypLKv1TYgcC cert\n"), false)
	f.Add([]byte(`command="a\"b" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN9hvUAdych7n6Te3aMn6fexm3ETu3ySnx1D010IXrAo`), false)
	f.Fuzz(func(t *testing.T, data []byte, ca bool) {
		keys, err := parseKeyFile("f", data, ca)
		if err != nil {
			if keys != nil {
				t.Fatalf("error %v with %d keys", err, len(keys))
			}
			return
		}
		for wire, e := range keys {
			k, err := ssh.ParsePublicKey([]byte(wire))
			if err != nil {
				t.Fatalf("%s: accepted key does not parse: %v", e.where, err)
			}
			if _, isCert := k.(*ssh.Certificate); isCert {
				t.Fatalf("%s: accepted a certificate", e.where)
			}
		}
	})
}

// FuzzCheckKey: any key or certificate a client can send (whatever parses
// as an SSH public key) is decided without a panic, and an accepted one
// carries its own wire form and an identity that names it.
func FuzzCheckKey(f *testing.F) {
	ca := newSigner(f)
	user := newSigner(f)
	ks := &keySet{
		users: map[string]keyEntry{string(user.PublicKey().Marshal()): {key: user.PublicKey()}},
		cas:   map[string]keyEntry{string(ca.PublicKey().Marshal()): {key: ca.PublicKey()}},
	}
	good := certTemplate(user.PublicKey(), "alice", "ops")
	if err := good.SignCert(randReader, ca); err != nil {
		f.Fatal(err)
	}
	odd := certTemplate(user.PublicKey())
	odd.CriticalOptions = map[string]string{"source-address": "127.0.0.1/33,::1"}
	signRaw(f, odd, ca, nil)
	f.Add(user.PublicKey().Marshal())
	f.Add(good.Marshal())
	f.Add(odd.Marshal())
	f.Add(ca.PublicKey().Marshal())
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2222}
	f.Fuzz(func(t *testing.T, wire []byte) {
		key, err := ssh.ParsePublicKey(wire)
		if err != nil {
			return
		}
		perms, err := checkKey(ks, key, remote, time.Now(), time.Minute)
		if err != nil {
			return
		}
		pr, err := provenOf(perms)
		if err != nil {
			t.Fatalf("accepted key's permissions: %v", err)
		}
		if string(pr.key.Marshal()) != string(key.Marshal()) || pr.id.Name == "" {
			t.Fatalf("accepted %s as %v", key.Type(), pr.id)
		}
	})
}
