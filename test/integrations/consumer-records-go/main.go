// The Go package as a peer of test/integrations/consumer_records.py: reads
// {"mode", "tenant", "cases": [[key, result], ...]} on stdin, runs
// idempotency.Run over each case (mode "write": fn returns the case's
// result; "replay": fn fails if it runs) and prints {key: {"result",
// "replayed"}} as one JSON line.  PG* environment variables; 79-go builds it
// inside a copy of the module (its vendor/), under the module's own path.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"

	_ "github.com/jackc/pgx/v4/stdlib"

	"github.com/idempotency-pg/idempotency/integrations/go"
)

type answer struct {
	Result   json.RawMessage `json:"result"`
	Replayed bool            `json:"replayed"`
}

func main() {
	var input struct {
		Mode, Tenant string
		Cases        [][2]json.RawMessage
	}
	if err := json.NewDecoder(os.Stdin).Decode(&input); err != nil {
		fail(err)
	}
	db, err := sql.Open("pgx", "")
	if err != nil {
		fail(err)
	}
	defer db.Close()
	answers := map[string]answer{}
	for _, c := range input.Cases {
		var key string
		if err := json.Unmarshal(c[0], &key); err != nil {
			fail(err)
		}
		result := c[1]
		out, replayed, err := idempotency.Run(context.Background(), db, input.Tenant, key,
			func(tx *sql.Tx) (json.RawMessage, error) {
				if input.Mode == "replay" {
					return nil, fmt.Errorf("the function ran for %s, which should replay", key)
				}
				return result, nil
			})
		if err != nil {
			fail(err)
		}
		answers[key] = answer{out, replayed}
	}
	if err := json.NewEncoder(os.Stdout).Encode(answers); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
