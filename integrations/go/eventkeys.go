package idempotency

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/jmespath/go-jmespath"
)

// ErrExpression: a JMESPath expression of NewEventKeys that is empty or does
// not compile (the error says which and where), or one that fails on an
// event (e.g. a function given the wrong type).
var ErrExpression = errors.New("idempotency: a JMESPath expression is invalid")

// EventKeys takes Run's key and fingerprint from an event (a message's JSON)
// by JMESPath expressions: AWS Powertools' event_key_jmespath and
// payload_validation_jmespath, the Python package's options of those names
// and the Node.js package's eventKeyJmesPath and payloadValidationJmesPath.
// The expressions are compiled once, by NewEventKeys, so a bad one is found
// at start-up; an EventKeys is safe for concurrent use.
type EventKeys struct {
	keyText, payloadText string
	key, payload         *jmespath.JMESPath
}

// NewEventKeys compiles eventKeyJMESPath (required: where the key is, e.g.
// "Records[?source=='orders'] | [0].messageId") and
// payloadValidationJMESPath (optional, "" for none: what makes the
// fingerprint, e.g. "Records[0].body.[order_id, amount]").  The whole
// JMESPath language of go-jmespath 0.4 is accepted.  An error wraps
// ErrExpression.
func NewEventKeys(eventKeyJMESPath, payloadValidationJMESPath string) (*EventKeys, error) {
	k := &EventKeys{keyText: eventKeyJMESPath, payloadText: payloadValidationJMESPath}
	var err error
	if k.key, err = compileExpression("eventKeyJMESPath", eventKeyJMESPath); err != nil {
		return nil, err
	}
	if payloadValidationJMESPath != "" {
		if k.payload, err = compileExpression("payloadValidationJMESPath", payloadValidationJMESPath); err != nil {
			return nil, err
		}
	}
	return k, nil
}

func compileExpression(what, text string) (*jmespath.JMESPath, error) {
	if strings.TrimSpace(text) == "" {
		return nil, fmt.Errorf("%w: %s must be a JMESPath expression, not empty", ErrExpression, what)
	}
	compiled, err := jmespath.Compile(text)
	if err != nil {
		var syntax jmespath.SyntaxError
		if errors.As(err, &syntax) {
			return nil, fmt.Errorf("%w: %s %q: %v at character %d\n%s", ErrExpression, what, text, err,
				syntax.Offset+1, syntax.HighlightLocation())
		}
		return nil, fmt.Errorf("%w: %s %q: %v", ErrExpression, what, text, err)
	}
	return compiled, nil
}

// Run is idempotency.Run with the key, and the fingerprint when
// payloadValidationJMESPath was given, taken from event:
//   - the key is the string the expression finds, or an integer's decimal
//     digits; an event where it finds nothing (a missing path, null) has no
//     key: ErrInvalidKey, or with opts' OptionalKey fn runs without a claim;
//     any other value (an object, a float, a boolean, "") is ErrInvalidKey;
//   - the fingerprint is "sha256:" and the SHA-256 of the value found as
//     canonical JSON (sorted keys, no spacing; null when nothing is found),
//     as the Python package computes it; opts' Fingerprint must then be
//     empty.
//
// An event that is not JSON is an error; nothing is claimed.
func (k *EventKeys) Run(ctx context.Context, db *sql.DB, tenant string, event []byte,
	fn func(tx *sql.Tx) (json.RawMessage, error), opts ...RunOptions) (json.RawMessage, bool, error) {
	var o RunOptions
	if len(opts) > 1 {
		return nil, false, errors.New("idempotency.EventKeys.Run takes at most one RunOptions")
	} else if len(opts) == 1 {
		o = opts[0]
	}
	var data any
	if err := json.Unmarshal(event, &data); err != nil {
		return nil, false, fmt.Errorf("idempotency: the event is not JSON: %w", err)
	}
	found, err := k.key.Search(data)
	if err != nil {
		return nil, false, fmt.Errorf("%w: eventKeyJMESPath %q on this event: %v", ErrExpression, k.keyText, err)
	}
	if found == nil {
		if o.OptionalKey {
			return runWithoutKey(ctx, db, fn)
		}
		return nil, false, fmt.Errorf("%w: the event has no key at %s", ErrInvalidKey, k.keyText)
	}
	key, err := keyText(found, k.keyText)
	if err != nil {
		return nil, false, err
	}
	o.OptionalKey = false // "" is a key found empty, refused by Run, not a missing one
	if k.payload != nil {
		if o.Fingerprint != "" {
			return nil, false, errors.New("idempotency: RunOptions.Fingerprint and payloadValidationJMESPath are" +
				" two ways of one option: give one")
		}
		value, err := k.payload.Search(data)
		if err != nil {
			return nil, false, fmt.Errorf("%w: payloadValidationJMESPath %q on this event: %v", ErrExpression,
				k.payloadText, err)
		}
		if o.Fingerprint, err = valueFingerprint(value); err != nil {
			return nil, false, err
		}
	}
	return Run(ctx, db, tenant, key, fn, o)
}

// keyText is the key a JMESPath expression found: a string as it is, an
// integer (exact in a float64) as its digits.
func keyText(found any, expression string) (string, error) {
	switch v := found.(type) {
	case string:
		return v, nil
	case float64:
		if v == math.Trunc(v) && math.Abs(v) <= 1<<53 {
			return strconv.FormatFloat(v, 'f', -1, 64), nil
		}
	}
	return "", fmt.Errorf("%w: the key at %s must be a string or an integer, not %s", ErrInvalidKey, expression,
		jsonType(found))
}

func jsonType(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case bool:
		return "a boolean"
	case float64:
		return "a number with a fraction or beyond 2^53"
	}
	return fmt.Sprintf("%T", v)
}

// valueFingerprint is "sha256:" and the SHA-256 of value as canonical JSON
// (encoding/json sorts object keys; no spacing, no HTML escaping).
func valueFingerprint(value any) (string, error) {
	text, err := json.Marshal(value)
	if err != nil {
		return "", fmt.Errorf("idempotency: the fingerprint's value: %w", err)
	}
	sum := sha256.Sum256(CanonicalJSON(text))
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
