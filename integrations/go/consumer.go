package idempotency

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// The outcomes of Run that are not a result; tell them apart with errors.Is
// and errors.As.
var (
	// ErrInProgress: another transaction holds the key now (an *InProgressError
	// says for how long at most): deliver the message again later.
	ErrInProgress = errors.New("idempotency: another delivery of this key is being processed now")
	// ErrMismatch: the key was used before with another fingerprint, a bug
	// upstream (dead-letter the message).
	ErrMismatch = errors.New("idempotency: this key was used before with another fingerprint")
	// ErrInvalidKey: the key or the tenant is empty, too long or not
	// printable ASCII; nothing was claimed.
	ErrInvalidKey = errors.New("idempotency: the key or the tenant is not usable")
)

// InProgressError is the ErrInProgress of one call: RetryAfter is how long
// to wait before delivering again, as the middleware's 409 says in
// Retry-After: the holder's lease left when its claim is committed, else
// the call's Wait or 1 s; between RetryAfterMin and RetryAfterMax seconds.
type InProgressError struct{ RetryAfter time.Duration }

func (e *InProgressError) Error() string {
	return fmt.Sprintf("%v; retry after %v", ErrInProgress, e.RetryAfter)
}

// Is makes errors.Is(err, ErrInProgress) true.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// TenantSettingError is the server's refusal of a claim when tenant isolation
// is on and the setting its policy reads is not set (SQLSTATE 55000): the
// middleware or Run was given no TenantSetting, or another setting's name.
// The server's hint says to call set_config by hand; this names the
// package's option instead.  It wraps the driver's error (errors.As reaches
// it) and reports the SQLSTATE as the driver's errors do (SQLState()).
type TenantSettingError struct {
	Setting string // the setting the isolation policy reads ("app.tenant")
	Given   string // the TenantSetting given ("" for none)
	Option  string // where it is given: "Config.TenantSetting" or "RunOptions.TenantSetting"
	Err     error  // the driver's error
}

func (e *TenantSettingError) Error() string {
	if e.Given != "" {
		return fmt.Sprintf("tenant isolation is on and its policy reads %q, but %s is %q (SQLSTATE 55000): set %s to %q",
			e.Setting, e.Option, e.Given, e.Option, e.Setting)
	}
	return fmt.Sprintf("tenant isolation is on, but %q is not set (SQLSTATE 55000): set %s to %q and the package"+
		" sets it to each call's tenant in the claim's transaction", e.Setting, e.Option, e.Setting)
}

// Unwrap gives the driver's error.
func (e *TenantSettingError) Unwrap() error { return e.Err }

// SQLState is the server's SQLSTATE, 55000.
func (e *TenantSettingError) SQLState() string { return "55000" }

// the server's message for an unset isolation setting, as the driver prints it
var tenantUnset = regexp.MustCompile(`tenant isolation is on, but "([^"]+)" is not set(?: \(SQLSTATE 55000\))?$`)

// tenantSettingError is err, or for the server's refusal of an unset
// isolation setting a *TenantSettingError naming option.
func tenantSettingError(err error, given, option string) error {
	var coded interface{ SQLState() string }
	if err == nil || !errors.As(err, &coded) || coded.SQLState() != "55000" {
		return err
	}
	if m := tenantUnset.FindStringSubmatch(err.Error()); m != nil {
		return &TenantSettingError{Setting: m[1], Given: given, Option: option, Err: err}
	}
	return err
}

// StoredFailureError: the key was settled earlier as a failure
// (idem_release with a failure document); Failure is that document.
type StoredFailureError struct{ Failure json.RawMessage }

func (e *StoredFailureError) Error() string {
	return "idempotency: this key was settled earlier as a failure: " + string(e.Failure)
}

// RunOptions configures one Run; the zero value takes the server's settings.
type RunOptions struct {
	// Fingerprint is compared when the key comes again (another one is
	// ErrMismatch); empty: no comparison.  Fingerprint() or a hash of your own.
	Fingerprint string
	// Lease, TTL and Wait are idem_claim's intervals for this call ("30
	// seconds"); Wait makes a duplicate wait that long for the running
	// delivery and return its result.
	Intervals
	// Holder says who claims (extension 1.4): a durable execution's ARN, a
	// workflow run id.  While a claim this holder committed is in progress
	// with a live lease, the same holder claims it again (fn runs, with the
	// record's token); any other holder, or none, gets ErrInProgress.
	// Empty: no holder is sent (the call works with 1.3 servers).
	Holder string
	// TenantSetting and BeforeClaim as in Config.
	TenantSetting string
	BeforeClaim   func(ctx context.Context, tx *sql.Tx, tenant string) error
	// Tracer as in Config: a span for idem_claim and one for idem_complete.
	Tracer trace.Tracer
	// OptionalKey: an empty key runs fn without a claim, in a transaction of
	// its own, storing nothing.  Default false: an empty key is ErrInvalidKey.
	OptionalKey bool
}

// Run runs fn at most once per (tenant, key), for a queue consumer, a job or
// any other at-least-once delivery: BEGIN, idem_claim, fn(tx), idem_complete
// with fn's result, COMMIT.  If fn returns an error or panics, everything
// rolls back (its writes and the claim) and the error is returned: the next
// delivery runs fn again.  A duplicate gets the stored result without
// running fn, with replayed true.  The result returned, the first time as on
// every duplicate, is the stored JSON as PostgreSQL prints it.  opts: at most one.
func Run(ctx context.Context, db *sql.DB, tenant, key string, fn func(tx *sql.Tx) (json.RawMessage, error),
	opts ...RunOptions) (result json.RawMessage, replayed bool, err error) {
	var o RunOptions
	if len(opts) > 1 {
		return nil, false, errors.New("idempotency.Run takes at most one RunOptions")
	} else if len(opts) == 1 {
		o = opts[0]
	}
	if o.TenantSetting != "" && !settingName.MatchString(o.TenantSetting) {
		return nil, false, fmt.Errorf("idempotency.RunOptions.TenantSetting must name a custom setting such as"+
			" app.tenant, not %q", o.TenantSetting)
	}
	if key == "" && o.OptionalKey {
		return runWithoutKey(ctx, db, fn)
	}
	for _, id := range []struct{ value, name string }{{tenant, "the tenant"}, {key, "the key"}} {
		if rf := checkIdentifier(id.value, id.name); rf != nil {
			return nil, false, fmt.Errorf("%w: %s", ErrInvalidKey, rf.reason())
		}
	}

	var outcome string
	var response sql.NullString
	var retry int
	err = inTx(ctx, db, func(tx *sql.Tx) error {
		if err := beforeClaim(ctx, tx, o.TenantSetting, o.BeforeClaim, tenant); err != nil {
			return err
		}
		var token sql.NullInt64
		spanCtx, span := startCall(ctx, o.Tracer, "idem_claim")
		claim, args := claimCall(o.Holder, tenant, key, nullable(o.Fingerprint), nullable(o.Lease),
			nullable(o.TTL), nullable(o.Wait))
		err := tx.QueryRowContext(spanCtx, `SELECT outcome, token, response::text, `+retryAfter+` FROM `+claim,
			args...).Scan(&outcome, &token, &response, &retry)
		endCall(span, outcome, err)
		if err != nil || outcome != "claimed" {
			return tenantSettingError(err, o.TenantSetting, "RunOptions.TenantSetting")
		}
		out, err := fn(tx)
		if err != nil {
			return err
		}
		if out == nil {
			out = json.RawMessage("null")
		}
		// store it and read back what was stored: the same bytes on every delivery
		spanCtx, span = startCall(ctx, o.Tracer, "idem_complete")
		err = tx.QueryRowContext(spanCtx,
			`SELECT d.r::text FROM (SELECT $4::jsonb) AS d(r), idem_complete($1, $2, $3, response => d.r)`,
			tenant, key, token.Int64, string(out)).Scan(&response)
		endCall(span, "", err)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	switch outcome {
	case "claimed", "replay":
		return json.RawMessage(response.String), outcome == "replay", nil
	case "failed":
		return nil, false, &StoredFailureError{json.RawMessage(response.String)}
	case "in_progress":
		return nil, false, &InProgressError{time.Duration(retry) * time.Second}
	default:
		return nil, false, ErrMismatch
	}
}

// runWithoutKey runs fn in a transaction of its own, claiming nothing.
func runWithoutKey(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) (json.RawMessage, error)) (
	result json.RawMessage, replayed bool, err error) {
	err = inTx(ctx, db, func(tx *sql.Tx) (err error) {
		result, err = fn(tx)
		return err
	})
	return result, false, err
}

// inTx runs work in a transaction, committed when it returns nil and rolled
// back when it returns an error or panics.
func inTx(ctx context.Context, db *sql.DB, work func(tx *sql.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback()
			panic(p)
		}
	}()
	if err = work(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
