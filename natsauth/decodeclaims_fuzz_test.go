package natsauth

import (
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// FuzzDecodeUserClaims: decodeUserClaims never panics, and it decodes
// every token the library verifies to the same user (it may take more:
// it does not check the signature).
func FuzzDecodeUserClaims(f *testing.F) {
	akp, _ := nkeys.CreateAccount()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = "alice"
	tok, err := uc.Encode(akp)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tok)
	f.Add(tok[:len(tok)-3])
	f.Add("a.b.c")
	f.Add("..")
	f.Add("eyJ0eXAiOiJKV1QifQ.e30.")
	f.Add("eyJ0eXAiOiJKV1QifQ.eyJuYXRzIjp7InR5cGUiOiJ1c2VyIiwidmVyc2lvbiI6Mn0sInN1YiI6IlUifQ.")
	f.Fuzz(func(t *testing.T, token string) {
		got, err := decodeUserClaims(token)
		want, werr := jwt.DecodeUserClaims(token)
		if werr != nil {
			return
		}
		if err != nil {
			t.Fatalf("the library verifies %q, decodeUserClaims refuses it: %v", token, err)
		}
		if got.Subject != want.Subject || got.Name != want.Name || got.IssuerAccount != want.IssuerAccount || got.Issuer != want.Issuer {
			t.Fatalf("decoded %+v, the library %+v", got, want)
		}
	})
}
