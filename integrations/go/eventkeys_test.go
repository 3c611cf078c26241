package idempotency_test

// EventKeys: the key and the fingerprint taken from an event by JMESPath,
// with the cases of the Python package's check_jmespath
// (integrations/python/tests/function_checks.py), a bad expression and a
// missing path.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idempotency-pg/idempotency/integrations/go"
)

// orderEvent is the Python test's event: a queue delivery whose body is the order.
func orderEvent(id string, amount int, note string) []byte {
	return []byte(fmt.Sprintf(`{"Records": [{"source": "other", "messageId": "not-this-one"},
		{"source": "orders", "messageId": %q, "body": {"order_id": "o-7", "amount": %d, "note": %q}}]}`,
		id, amount, note))
}

func TestEventKeysBadExpression(t *testing.T) {
	for _, c := range []struct{ key, payload, says string }{
		{"Records[?source=='orders'", "", `eventKeyJMESPath "Records[?source=='orders'"`},
		{"id", "Records[0].body.[order_id,", `payloadValidationJMESPath "Records[0].body.[order_id,"`},
		{"  ", "", "eventKeyJMESPath must be a JMESPath expression, not empty"},
	} {
		k, err := idempotency.NewEventKeys(c.key, c.payload)
		if k != nil || !errors.Is(err, idempotency.ErrExpression) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("NewEventKeys(%q, %q): want ErrExpression naming %s, got %v", c.key, c.payload, c.says, err)
		}
	}
	_, err := idempotency.NewEventKeys("a.[b", "")
	if err == nil || !strings.Contains(err.Error(), "SyntaxError") || !strings.Contains(err.Error(), "at character") {
		t.Errorf("a syntax error says where: %v", err)
	}
}

func TestEventKeys(t *testing.T) {
	needDB(t)
	ctx := context.Background()
	keys, err := idempotency.NewEventKeys("Records[?source=='orders'] | [0].messageId",
		"Records[?source=='orders'] | [0].body.[order_id, amount]")
	if err != nil {
		t.Fatal(err)
	}
	opts := idempotency.RunOptions{TenantSetting: tenantSetting}
	runs := 0
	consume := func(tx *sql.Tx) (json.RawMessage, error) {
		runs++
		return json.RawMessage(fmt.Sprintf(`{"n": %d}`, runs)), nil
	}
	first, replayed1, err1 := keys.Run(ctx, appDB, tenant, orderEvent("jm-1", 5, "first"), consume, opts)
	again, replayed2, err2 := keys.Run(ctx, appDB, tenant, orderEvent("jm-1", 5, "redelivered"), consume, opts)
	_, _, err3 := keys.Run(ctx, appDB, tenant, orderEvent("jm-1", 6, "first"), consume, opts)
	if err1 != nil || err2 != nil || replayed1 || !replayed2 || runs != 1 || string(first) != `{"n": 1}` ||
		string(again) != string(first) || !errors.Is(err3, idempotency.ErrMismatch) {
		t.Errorf("the filter expression's key, the fingerprint of [order_id, amount]: another note replays, another"+
			" amount is a mismatch: %s %v %v / %s %v %v / %v, %d runs", first, replayed1, err1, again, replayed2, err2,
			err3, runs)
	}
	// the Python package's fingerprint of the same value: "sha256:" + SHA-256 of canonical JSON ["o-7",5]
	const python = "sha256:a007556c9dfd1fc52e8bd70797b8248871985227e09a380eaabec0b52c47347a"
	var stored string
	if err := db.QueryRow(`SELECT fingerprint FROM idempotency_records WHERE tenant_id = $1 AND key = 'jm-1'`,
		tenant).Scan(&stored); err != nil || stored != python {
		t.Errorf("the stored fingerprint is the Python package's for the same value: %q %v", stored, err)
	}

	// a missing path: no key (refused, or run without a claim under OptionalKey) ...
	noKey := []byte(`{"Records": [{"source": "other", "messageId": "x"}]}`)
	before := runs
	if _, _, err := keys.Run(ctx, appDB, tenant, noKey, consume, opts); !errors.Is(err, idempotency.ErrInvalidKey) ||
		!strings.Contains(err.Error(), "no key at Records[?source=='orders'] | [0].messageId") || runs != before {
		t.Errorf("an event without the key's path: ErrInvalidKey naming the expression, fn not run: %v", err)
	}
	optional := opts
	optional.OptionalKey = true
	if _, replayed, err := keys.Run(ctx, appDB, tenant, noKey, consume, optional); err != nil || replayed ||
		runs != before+1 {
		t.Errorf("OptionalKey: an event without the key runs fn without a claim: %v %d", err, runs)
	}
	// ... and null in the fingerprint: the payload path missing is the fingerprint of null
	pathOnly, err := idempotency.NewEventKeys("id", "body.amount")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := pathOnly.Run(ctx, appDB, tenant, []byte(`{"id": "jm-2"}`), consume, opts); err != nil {
		t.Fatal(err)
	}
	_ = db.QueryRow(`SELECT fingerprint FROM idempotency_records WHERE tenant_id = $1 AND key = 'jm-2'`,
		tenant).Scan(&stored)
	const null = "sha256:74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b" // SHA-256 of null
	_, replayed, err := pathOnly.Run(ctx, appDB, tenant, []byte(`{"id": "jm-2", "body": {"amount": null}}`), consume, opts)
	if stored != null || err != nil || !replayed {
		t.Errorf("a missing payload path fingerprints as null (%q), the same as an explicit null: %v %v", stored,
			replayed, err)
	}
	// an integer key is its digits; other values are refused
	if _, _, err := pathOnly.Run(ctx, appDB, tenant, []byte(`{"id": 4207}`), consume, opts); err != nil {
		t.Errorf("an integer key: %v", err)
	} else if status, _, _ := record(t, "4207"); status == "" {
		t.Error("an integer key is stored as its digits (4207)")
	}
	for _, event := range []string{`{"id": {"a": 1}}`, `{"id": 1.5}`, `{"id": true}`, `{"id": ""}`} {
		if _, _, err := pathOnly.Run(ctx, appDB, tenant, []byte(event), consume, optional); !errors.Is(err,
			idempotency.ErrInvalidKey) {
			t.Errorf("the key of %s is refused, even under OptionalKey: %v", event, err)
		}
	}
	if _, _, err := pathOnly.Run(ctx, appDB, tenant, []byte(`{"id": "jm-3"`), consume, opts); err == nil ||
		!strings.Contains(err.Error(), "not JSON") {
		t.Errorf("an event that is not JSON: %v", err)
	}
	both := opts
	both.Fingerprint = "fp"
	if _, _, err := pathOnly.Run(ctx, appDB, tenant, []byte(`{"id": "jm-4"}`), consume, both); err == nil ||
		!strings.Contains(err.Error(), "give one") {
		t.Errorf("RunOptions.Fingerprint beside payloadValidationJMESPath is refused: %v", err)
	}
}
