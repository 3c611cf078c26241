// Package idempotency is net/http middleware for the idempotency PostgreSQL
// extension: a handler runs at most once per (tenant, Idempotency-Key), and
// its writes, the claim and the stored response are ONE database
// transaction, committed before a byte of the answer is sent.
//
//	BEGIN; idem_claim(tenant, key, fingerprint)
//	  claimed      the handler runs with the transaction (FromContext); its
//	               answer is stored (idem_complete, or idem_release with the
//	               failure for a 4xx) and COMMITted, then sent
//	  replay       the stored status and body, Idempotent-Replayed: true
//	  failed       the stored failure,          Idempotent-Replayed: true
//	  in_progress  409 + Retry-After: the seconds left of the original's
//	               lease if its claim is committed, else Wait or 1, at most
//	               60 (with Wait, after waiting that long for its answer)
//	  mismatch     422 (the key was used for another request)
//
// A handler that panics or answers a status StoreStatus refuses (by default
// a 5xx, 408, 409, 425 or 429) is rolled back: its writes and the claim go
// together, nothing is stored, and a retry runs again.
//
// Run does the same for a queue consumer or a job: fn runs at most once per
// (tenant, key) in the claim's transaction, its result stored and returned
// on every duplicate.
//
// Byte-identical replays: the body sent is the stored jsonb as PostgreSQL
// prints it, read back by the statement that stores it, for the first
// answer as for every replay.
//
// The package uses database/sql, so any PostgreSQL driver works (the tests
// and the example use pgx's github.com/jackc/pgx/v4/stdlib); EventKeys takes
// Run's key and fingerprint from an event by JMESPath (go-jmespath); with
// Config.Tracer or RunOptions.Tracer set, each call of the extension's
// functions is an OpenTelemetry span (telemetry.go).
package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"regexp"
	"runtime/debug"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// MaxIdentifierBytes is the extension's limit on a tenant id and a key.
const MaxIdentifierBytes = 255

// Version is this package's version; it works with the idempotency extension 1.2 and later.
const Version = "0.3.0"

// The same in the Python, Node.js and Go packages (docs/integrations.md, "One
// behaviour in three packages"): the titles of the problem documents...
const (
	TitleKeyRequired   = "An Idempotency-Key header is required"
	TitleKeyInvalid    = "The Idempotency-Key header is invalid"
	TitleTenantInvalid = "The tenant is invalid"
	TitleInProgress    = "A request with this Idempotency-Key is still being processed"
	TitleMismatch      = "This Idempotency-Key was used for a different request"
	TitleInternal      = "Internal error"
)

// DefaultReplayedHeaders are the headers a stored answer keeps and replays
// when Config.ReplayedHeaders is nil (an allow-list).
var DefaultReplayedHeaders = []string{"Location", "Content-Location", "Link"}

// RetryAfterMin and RetryAfterMax bound a 409's Retry-After and
// InProgressError.RetryAfter, in seconds.
const (
	RetryAfterMin = 1
	RetryAfterMax = 60
)

// retryAfter is the seconds of a 409's Retry-After: those left of the
// holder's lease when its end is known (a committed claim, the two-phase
// pattern); while the holder has not committed its claim (claim and handler
// in one transaction: the usual case) its answer comes with its commit, so
// the call's wait (a duplicate that waited that long tries again after as
// long), else 1; between RetryAfterMin and RetryAfterMax.  $6 is the call's
// wait.
var retryAfter = fmt.Sprintf(`greatest(%d, least(%d, ceil(extract(epoch FROM
	coalesce(expires_at - clock_timestamp(), $6::interval, interval '1 second')))))::int`, RetryAfterMin, RetryAfterMax)

// DefaultStoreStatus says which answers are stored and replayed when
// Config.StoreStatus is nil: 2xx, 3xx and the deterministic 4xx (not 408,
// 409, 425, 429); never a 5xx.
func DefaultStoreStatus(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// Intervals are idem_claim's intervals for one call ("30 seconds", "1 day");
// empty means the Config's, and there the server's settings.
type Intervals struct {
	Lease, TTL, Wait string
}

// Config configures Middleware.
type Config struct {
	// DB is the database with the extension (required).
	DB *sql.DB
	// Tenant says whose key this is: return the authenticated principal's
	// id.  Default: the header TenantHeader names.
	Tenant func(r *http.Request) (string, error)
	// TenantHeader is the header the tenant is read from when Tenant is nil
	// (default X-Client-Id, a stand-in for authentication).
	TenantHeader string
	// Lease and TTL are intervals for idem_claim ("30 seconds", "1 day");
	// empty means the server's settings.  A 409's Retry-After is the lease
	// left of a committed claim (at most RetryAfterMax).
	Lease, TTL string
	// Wait is how long a duplicate waits for the original's answer, which it
	// replays if it comes within the wait; else 409.  Empty: 409 at once.
	Wait string
	// Holder, when set, says who claims a request (extension 1.4): a claim
	// this holder committed and still holds (a live lease) is claimed again
	// by the same holder; any other holder or none gets 409.  An empty
	// answer, or a nil Holder, sends no holder (the call works with 1.3).
	Holder func(r *http.Request) string
	// PerRequest, when set, gives one request's intervals; those it leaves
	// empty are the Config's.
	PerRequest func(r *http.Request) Intervals
	// OptionalKey lets a request without an Idempotency-Key header through
	// untouched: no claim, no transaction, FromContext reports false.  A
	// header that is present but invalid is still refused (400).  Default
	// false: a missing key is a 400 (raise_on_missing_key in the Python
	// package, raiseOnMissingKey in Node.js: Go's zero value is the default).
	OptionalKey bool
	// StoreStatus says which answers are stored and replayed (nil:
	// DefaultStoreStatus).  An answer not stored is sent once and rolled
	// back with the handler's writes and the claim.
	StoreStatus func(status int) bool
	// ReplayedHeaders are the handler's headers stored and replayed, an
	// allow-list (nil: DefaultReplayedHeaders).  Content-Type is always kept.
	ReplayedHeaders []string
	// ResponseHook, when set, is called before every stored answer (the
	// first) and every replay is sent, with its headers and whether it is a
	// replay; not for a 400, 409, 422 or an answer not stored.
	ResponseHook func(header http.Header, replayed bool)
	// BeforeClaim, when set, runs in the claim's transaction before the claim,
	// after TenantSetting (e.g. SET LOCAL ROLE, or settings of your own per
	// tenant).  An error answers 500 and stores nothing.
	BeforeClaim func(ctx context.Context, tx *sql.Tx, tenant string) error
	// MaxBodyBytes bounds the request body read for the fingerprint
	// (default 1 MiB); a larger body is refused with 413 before any claim.
	MaxBodyBytes int64
	// Logger receives the errors the client only sees as a 500 (default log.Default()).
	Logger *log.Logger
	// Tracer, when set, gets a client span for each call of the extension's
	// functions (idem_claim, then idem_complete or idem_release), a child of
	// the request context's span, with db.system.name, db.operation.name,
	// and on idem_claim's idempotency.outcome and idempotency.replayed:
	// otel.Tracer(TracerName).  Nil (default): no spans, no cost.
	Tracer trace.Tracer
	// TenantSetting, with tenant isolation on (idem_set_tenant_isolation(true,
	// 'app.tenant')), is the setting its policy reads: the transaction runs
	// set_config(TenantSetting, tenant, true) before the claim, so the claim,
	// the handler and the stored answer run as that tenant.  Empty (default):
	// nothing is set.
	TenantSetting string
}

// settingName is a custom setting as idem_set_tenant_isolation accepts it:
// two or more dot-separated identifiers ("app.tenant").
var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)+$`)

// Claim is what the one request that runs the handler gets from FromContext.
type Claim struct {
	Tenant string
	Key    string
	Token  int64   // the fencing token (a bigint: exact in int64)
	Tx     *sql.Tx // the claim's transaction: write through it; never Commit or Rollback it
}

type claimContextKey struct{}

// FromContext returns the claim of a request the middleware let through to
// the handler, and false for a request without a key under OptionalKey.
func FromContext(ctx context.Context) (*Claim, bool) {
	c, ok := ctx.Value(claimContextKey{}).(*Claim)
	return c, ok
}

// bodyText is the body to send, as PostgreSQL prints the stored jsonb (the
// whole document if it is not one of ours).
func bodyText(expr string) string {
	return fmt.Sprintf("coalesce(%s->'body', %s)::text", expr, expr)
}

// refusal is a 400 answered before any claim.
type refusal struct{ title, detail string }

func (r *refusal) Error() string { return r.title }

// Middleware returns the middleware for cfg; it panics when cfg.DB is nil or
// cfg.TenantSetting is not a custom setting's name, programming errors found
// at start-up.
func Middleware(cfg Config) func(http.Handler) http.Handler {
	if cfg.DB == nil {
		panic("idempotency.Middleware needs Config.DB.")
	}
	if cfg.TenantSetting != "" && !settingName.MatchString(cfg.TenantSetting) {
		panic(fmt.Sprintf("idempotency.Config.TenantSetting must name a custom setting such as app.tenant"+
			" (two or more dot-separated identifiers), not %q.", cfg.TenantSetting))
	}
	if cfg.Tenant == nil {
		header := cfg.TenantHeader
		if header == "" {
			header = "X-Client-Id"
		}
		cfg.Tenant = func(r *http.Request) (string, error) { return r.Header.Get(header), nil }
	}
	if cfg.StoreStatus == nil {
		cfg.StoreStatus = DefaultStoreStatus
	}
	if cfg.ReplayedHeaders == nil {
		cfg.ReplayedHeaders = DefaultReplayedHeaders
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = log.Default()
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			serve(cfg, next, w, r)
		})
	}
}

func serve(cfg Config, next http.Handler, w http.ResponseWriter, r *http.Request) {
	keyHeaders := r.Header.Values("Idempotency-Key")
	if cfg.OptionalKey && len(keyHeaders) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	key, refused := ParseIdempotencyKey(keyHeaders)
	if refused != nil {
		var rf *refusal
		errors.As(refused, &rf)
		problem(w, http.StatusBadRequest, rf.title, rf.detail)
		return
	}
	tenant, err := cfg.Tenant(r)
	if err != nil {
		cfg.Logger.Printf("idempotency: the tenant function failed: %v", err)
		problem(w, http.StatusInternalServerError, TitleInternal, "Nothing was stored; retrying with the same key is safe.")
		return
	}
	if err := checkIdentifier(tenant, "the tenant"); err != nil {
		problem(w, http.StatusBadRequest, TitleTenantInvalid, err.reason())
		return
	}
	intervals := Intervals{cfg.Lease, cfg.TTL, cfg.Wait}
	if cfg.PerRequest != nil {
		intervals = intervals.override(cfg.PerRequest(r))
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, cfg.MaxBodyBytes+1))
	if err != nil {
		problem(w, http.StatusBadRequest, "the request body could not be read", "")
		return
	}
	if int64(len(body)) > cfg.MaxBodyBytes {
		problem(w, http.StatusRequestEntityTooLarge, "the request body is too large",
			fmt.Sprintf("The limit is %d bytes.", cfg.MaxBodyBytes))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))

	// The request's context: if the client goes away, database/sql rolls the
	// transaction back, so a handler still running cannot commit anything.
	ctx := r.Context()
	tx, err := cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		internalError(cfg, w, fmt.Errorf("beginning the transaction: %w", err))
		return
	}
	if err = beforeClaim(ctx, tx, cfg.TenantSetting, cfg.BeforeClaim, tenant); err != nil {
		_ = tx.Rollback()
		internalError(cfg, w, err)
		return
	}
	var outcome string
	var token sql.NullInt64
	var response, answer sql.NullString
	var retry int
	spanCtx, span := startCall(ctx, cfg.Tracer, "idem_claim")
	holder := ""
	if cfg.Holder != nil {
		holder = cfg.Holder(r)
	}
	call, args := claimCall(holder, tenant, key, Fingerprint(r.Method, r.URL.RequestURI(), body),
		nullable(intervals.Lease), nullable(intervals.TTL), nullable(intervals.Wait))
	err = tx.QueryRowContext(spanCtx,
		`SELECT outcome, token, response::text, `+bodyText("response")+`, `+retryAfter+` FROM `+call, args...,
	).Scan(&outcome, &token, &response, &answer, &retry)
	endCall(span, outcome, err)
	if err == nil && outcome != "claimed" {
		err = tx.Commit()
	}
	if err != nil {
		_ = tx.Rollback()
		internalError(cfg, w, fmt.Errorf("claiming the key: %w", tenantSettingError(err, cfg.TenantSetting,
			"Config.TenantSetting")))
		return
	}
	switch outcome {
	case "claimed":
	case "replay", "failed":
		sendStored(w, response.String, answer.String, true, cfg.ResponseHook)
		return
	case "in_progress":
		w.Header().Set("Retry-After", fmt.Sprint(retry))
		problem(w, http.StatusConflict, TitleInProgress, "Retry later with the same key.")
		return
	default: // mismatch
		problem(w, http.StatusUnprocessableEntity, TitleMismatch, "A key must not be reused with another payload.")
		return
	}

	// claimed: this request, and only this one, runs the handler
	claim := &Claim{Tenant: tenant, Key: key, Token: token.Int64, Tx: tx}
	held := &heldAnswer{header: http.Header{}}
	if !runHandler(cfg, next, held, r.WithContext(context.WithValue(ctx, claimContextKey{}, claim))) {
		_ = tx.Rollback()
		problem(w, http.StatusInternalServerError, TitleInternal, "Nothing was stored; retrying with the same key is safe.")
		return
	}
	if !cfg.StoreStatus(held.status) { // by default a 5xx
		_ = tx.Rollback() // writes and claim go together; a retry runs again
		held.sendAsIs(w)
		return
	}
	document, err := storedDocument(held, cfg.ReplayedHeaders)
	if err == nil {
		op, fn := "idem_complete", "idem_complete($1, $2, $3, response => d.r)"
		if held.status >= 400 {
			op, fn = "idem_release", "idem_release($1, $2, $3, failure => d.r)"
		}
		// store it, and read back what was stored: the answer is rendered from that
		spanCtx, span := startCall(ctx, cfg.Tracer, op)
		err = tx.QueryRowContext(spanCtx,
			`SELECT d.r::text, `+bodyText("d.r")+` FROM (SELECT $4::jsonb) AS d(r), `+fn,
			tenant, key, token.Int64, string(document)).Scan(&response, &answer)
		endCall(span, "", err)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		_ = tx.Rollback()
		internalError(cfg, w, fmt.Errorf("storing the answer: %w", err))
		return
	}
	sendStored(w, response.String, answer.String, false, cfg.ResponseHook)
}

// claimCall is the idem_claim call of a claim, $1..$6 the tenant, key,
// fingerprint, lease, ttl and wait, and its arguments: holder => $7 only when
// holder is set (extension 1.4), so that a call without one is 1.3's.
func claimCall(holder string, args ...any) (string, []any) {
	call := `idem_claim($1, $2, $3, lease => $4::interval, ttl => $5::interval, wait => $6::interval`
	if holder == "" {
		return call + `)`, args
	}
	return call + `, holder => $7::text)`, append(args, holder)
}

// override is i with the non-empty intervals of call.
func (i Intervals) override(call Intervals) Intervals {
	for _, v := range []struct {
		to   *string
		from string
	}{{&i.Lease, call.Lease}, {&i.TTL, call.TTL}, {&i.Wait, call.Wait}} {
		if v.from != "" {
			*v.to = v.from
		}
	}
	return i
}

// beforeClaim runs set_config(setting, tenant, true) when setting is set, then
// hook when it is set, in the claim's transaction before the claim.
func beforeClaim(ctx context.Context, tx *sql.Tx, setting string, hook func(context.Context, *sql.Tx, string) error,
	tenant string) error {
	if setting != "" {
		// transaction-local (is_local true): it ends with the transaction, also
		// through PgBouncer's transaction pooling
		if _, err := tx.ExecContext(ctx, `SELECT pg_catalog.set_config($1, $2, true)`, setting, tenant); err != nil {
			return fmt.Errorf("setting %s: %w", setting, err)
		}
	}
	if hook != nil {
		if err := hook(ctx, tx, tenant); err != nil {
			return fmt.Errorf("BeforeClaim: %w", err)
		}
	}
	return nil
}

// runHandler runs the handler into held; false when it panicked (logged).
func runHandler(cfg Config, next http.Handler, held *heldAnswer, r *http.Request) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p) // the handler asked to abort the connection: roll back happens via the context
			}
			cfg.Logger.Printf("idempotency: the handler panicked, rolled back: %v\n%s", p, debug.Stack())
			ok = false
		}
	}()
	next.ServeHTTP(held, r)
	if held.status == 0 {
		held.status = http.StatusOK
	}
	return true
}

// heldAnswer is the handler's ResponseWriter: it keeps the answer until it
// is stored and committed.
type heldAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *heldAnswer) Header() http.Header { return h.header }

func (h *heldAnswer) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
}

func (h *heldAnswer) Write(p []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	return h.body.Write(p)
}

// sendAsIs sends a 5xx answer as the handler wrote it (nothing was stored).
func (h *heldAnswer) sendAsIs(w http.ResponseWriter) {
	for name, values := range h.header {
		w.Header()[name] = values
	}
	w.WriteHeader(h.status)
	_, _ = w.Write(h.body.Bytes())
}

// storedDocument is the handler's answer as the document kept in
// idempotency_records.response: {"status", "headers"?, "body" | "body_base64", "content_type"?}.
func storedDocument(h *heldAnswer, replayed []string) ([]byte, error) {
	doc := map[string]any{"status": h.status}
	headers := map[string]any{}
	for _, name := range replayed {
		values := h.header.Values(name)
		if len(values) == 0 || strings.EqualFold(name, "Content-Type") {
			continue
		}
		if len(values) == 1 {
			headers[strings.ToLower(name)] = values[0]
		} else {
			headers[strings.ToLower(name)] = values
		}
	}
	if len(headers) > 0 {
		doc["headers"] = headers
	}
	contentType := h.header.Get("Content-Type")
	var parsed json.RawMessage
	if strings.Contains(contentType, "json") && json.Valid(h.body.Bytes()) && h.body.Len() > 0 {
		parsed = json.RawMessage(h.body.Bytes())
		doc["body"] = parsed
		if !strings.HasPrefix(contentType, "application/json") {
			doc["content_type"] = contentType
		}
	} else {
		doc["body_base64"] = base64.StdEncoding.EncodeToString(h.body.Bytes()) // not JSON: the exact bytes
		if contentType == "" {
			contentType = "application/octet-stream"
		}
		doc["content_type"] = contentType
	}
	return json.Marshal(doc)
}

// sendStored sends a stored document; body is its body as PostgreSQL printed
// it; hook, when set, runs before it is sent.
func sendStored(w http.ResponseWriter, document, body string, replayed bool, hook func(http.Header, bool)) {
	var doc struct {
		Status      *int            `json:"status"`
		Headers     map[string]any  `json:"headers"`
		BodyBase64  *string         `json:"body_base64"`
		ContentType *string         `json:"content_type"`
		Body        json.RawMessage `json:"body"`
	}
	bytesToSend := []byte(body)
	// not one of ours, e.g. the extension's {"error": "lease_expired"} under stale_action = 'fail'
	if err := json.Unmarshal([]byte(document), &doc); err != nil || doc.Status == nil {
		status := http.StatusInternalServerError
		doc.Status, doc.Headers, doc.BodyBase64, doc.ContentType = &status, nil, nil, nil
	}
	if doc.BodyBase64 != nil {
		if decoded, err := base64.StdEncoding.DecodeString(*doc.BodyBase64); err == nil {
			bytesToSend = decoded
		}
	}
	for name, value := range doc.Headers {
		switch v := value.(type) {
		case string:
			w.Header().Set(name, v)
		case []any:
			for _, item := range v {
				if s, ok := item.(string); ok {
					w.Header().Add(name, s)
				}
			}
		}
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	contentType := "application/json"
	if doc.ContentType != nil {
		contentType = *doc.ContentType
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", fmt.Sprint(len(bytesToSend)))
	if hook != nil {
		hook(w.Header(), replayed)
	}
	w.WriteHeader(*doc.Status)
	_, _ = w.Write(bytesToSend)
}

// problem answers an RFC 7807 problem document, as the IETF Idempotency-Key draft recommends.
func problem(w http.ResponseWriter, status int, title, detail string) {
	doc := map[string]any{"type": "about:blank", "title": title, "status": status}
	if detail != "" {
		doc["detail"] = detail
	}
	text, _ := json.Marshal(doc)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", fmt.Sprint(len(text)))
	w.WriteHeader(status)
	_, _ = w.Write(text)
}

func internalError(cfg Config, w http.ResponseWriter, err error) {
	cfg.Logger.Printf("idempotency: %v", err)
	problem(w, http.StatusInternalServerError, TitleInternal, "Nothing was stored; retrying with the same key is safe.")
}

func nullable(interval string) any {
	if interval == "" {
		return nil
	}
	return interval
}

// reason is the refusal as one sentence, for a problem's detail.
func (r *refusal) reason() string {
	text := r.title + "."
	if r.detail != "" {
		text = r.title + ": " + r.detail
	}
	return strings.ToUpper(text[:1]) + text[1:]
}

// checkIdentifier accepts printable ASCII of 1..255 bytes (so bytes == characters).
func checkIdentifier(value, name string) *refusal {
	if value == "" {
		return &refusal{name + " must not be empty", ""}
	}
	if len(value) > MaxIdentifierBytes {
		return &refusal{name + " is too long", fmt.Sprintf("%d bytes; the limit is %d.", len(value), MaxIdentifierBytes)}
	}
	for i := 0; i < len(value); i++ {
		if value[i] < 0x20 || value[i] > 0x7e {
			return &refusal{name + " must be printable ASCII", ""}
		}
	}
	return nil
}

// ParseIdempotencyKey returns the key of the Idempotency-Key header's values:
// one header, an sf-string ("abc", RFC 8941) as the IETF draft sends it or
// bare (abc) as Stripe does, of 1..255 printable ASCII bytes.
func ParseIdempotencyKey(values []string) (string, error) {
	if len(values) == 0 {
		return "", &refusal{TitleKeyRequired, "Send a unique key per operation, e.g. a UUID v4."}
	}
	if len(values) > 1 {
		return "", &refusal{TitleKeyInvalid, "Only one Idempotency-Key header is allowed."}
	}
	raw := strings.Trim(values[0], " \t")
	if strings.HasPrefix(raw, `"`) {
		unquoted, ok := parseSFString(raw)
		if !ok {
			return "", &refusal{TitleKeyInvalid, "The Idempotency-Key is not a valid structured-field string."}
		}
		raw = unquoted
	}
	if err := checkIdentifier(raw, "the Idempotency-Key"); err != nil {
		return "", &refusal{TitleKeyInvalid, err.reason()}
	}
	return raw, nil
}

// parseSFString unquotes an RFC 8941 sf-string: "..." with \" and \\ escapes only.
func parseSFString(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	var out strings.Builder
	inner := s[1 : len(s)-1]
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch c {
		case '\\':
			if i+1 >= len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
				return "", false
			}
			i++
			out.WriteByte(inner[i])
		case '"':
			return "", false
		default:
			out.WriteByte(c)
		}
	}
	return out.String(), true
}

// Fingerprint is what makes two requests "the same": a SHA-256 of the
// method, the path with its query and the body, canonical JSON when the
// body is JSON (object keys sorted, no spacing) and the raw bytes otherwise.
func Fingerprint(method, requestURI string, body []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", method, requestURI)
	h.Write(CanonicalJSON(body))
	return hex.EncodeToString(h.Sum(nil))
}

// CanonicalJSON returns body re-encoded with sorted object keys and no
// spacing (numbers kept as written), or body itself when it is not JSON.
func CanonicalJSON(body []byte) []byte {
	decoder := json.NewDecoder(bytes.NewReader(body))
	decoder.UseNumber()
	var value any
	if err := decoder.Decode(&value); err != nil || decoder.More() {
		return body
	}
	var out bytes.Buffer
	encoder := json.NewEncoder(&out)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(value); err != nil { // encoding/json sorts map keys
		return body
	}
	return bytes.TrimRight(out.Bytes(), "\n")
}
