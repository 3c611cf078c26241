// What the examples of integrations/go/README.md leave to their reader, typed
// as a real service's would be (test/docs/package_examples.py builds each
// example with this file, go build and go vet).  Only names the README does not
// define: never the package's own, so what is checked is the README's code as
// written.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"time"
)

// the service's database and the context of a consumer's loop
var (
	db  *sql.DB
	ctx = context.Background()
)

// the application's own: authentication, validation, a request's amount
type user struct{ ClientID string }

func userFrom(r *http.Request) user            { return user{ClientID: r.Header.Get("X-Client-Id")} }
func validate(next http.Handler) http.Handler  { return next }
func clientID(r *http.Request) (string, error) { return userFrom(r).ClientID, nil }
func book(tx *sql.Tx) (json.RawMessage, error) { return json.RawMessage(`{}`), nil }
func ack(m message)                            {}
func requeue(m message, after time.Duration)   {}
func deadLetter(m message)                     {}

var amount int64

// a message from the broker: its id, its JSON body and fields read from it
// (ExecutionID: the durable execution that sent it, for the Holder example)
type message struct {
	ID, OrderID, AmountHash, ExecutionID string
	Amount                               int64
	Body                                 []byte
}

var msg message

func main() {}
