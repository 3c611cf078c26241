package idempotency_test

// The options the three packages share (docs/integrations.md, "One behaviour
// in three packages"), and Run, the consumer wrapper.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-pg/idempotency/integrations/go"
)

// statusHandler writes a row and answers the status of X-Status with Location and X-Trace.
func statusHandler(w http.ResponseWriter, r *http.Request) {
	claim, _ := idempotency.FromContext(r.Context())
	if _, err := claim.Tx.ExecContext(r.Context(), `INSERT INTO test_writes (tenant, key) VALUES ($1, $2)`,
		claim.Tenant, claim.Key); err != nil {
		panic(err)
	}
	status, _ := strconv.Atoi(r.Header.Get("X-Status"))
	w.Header().Set("Location", "/things/"+claim.Key)
	w.Header().Set("X-Trace", "trace-"+claim.Key)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"key": %q}`, claim.Key)
}

var hooks []bool

func optionsServer(t *testing.T, cfg idempotency.Config) *httptest.Server {
	t.Helper()
	cfg.DB, cfg.TenantSetting, cfg.Logger = appDB, tenantSetting, log.New(io.Discard, "", 0)
	cfg.TenantHeader = "X-Shop"
	cfg.ResponseHook = func(h http.Header, replayed bool) {
		hooks = append(hooks, replayed)
		h.Set("X-Hook", map[bool]string{true: "replay", false: "first"}[replayed])
	}
	s := httptest.NewServer(idempotency.Middleware(cfg)(http.HandlerFunc(statusHandler)))
	t.Cleanup(s.Close)
	return s
}

func postStatus(t *testing.T, s *httptest.Server, k string, status int, extra ...string) reply {
	t.Helper()
	return post(t, s, key(k), `{"n": 1}`, append([]string{"X-Shop", tenant, "X-Status", strconv.Itoa(status)}, extra...)...)
}

func title(r reply) string {
	var doc struct{ Title string }
	_ = json.Unmarshal(r.body, &doc)
	return doc.Title
}

// asTenant begins a transaction of the application role, as this run's tenant when isolation is on.
func asTenant(t *testing.T) *sql.Tx {
	t.Helper()
	tx, err := appDB.Begin()
	if err == nil && tenantSetting != "" {
		_, err = tx.Exec(`SELECT set_config($1, $2, true)`, tenantSetting, tenant)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// completeLater claims k as this run's tenant in a transaction of its own,
// and completes it with response and commits 300 ms later.
func completeLater(t *testing.T, k, response string) {
	t.Helper()
	holder := asTenant(t)
	var token int64
	if err := holder.QueryRow(`SELECT token FROM idem_claim($1, $2)`, tenant, k).Scan(&token); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = holder.Exec(`SELECT idem_complete($1, $2, $3, $4::jsonb)`, tenant, k, token, response)
		_ = holder.Commit()
	}()
}

func TestTitlesAndTenantHeader(t *testing.T) {
	needDB(t)
	s := optionsServer(t, idempotency.Config{})
	for name, c := range map[string]struct {
		r     reply
		title string
	}{
		"no key":      {post(t, s, nil, `{}`, "X-Shop", tenant), idempotency.TitleKeyRequired},
		"invalid key": {post(t, s, key(strings.Repeat("k", 256)), `{}`, "X-Shop", tenant), idempotency.TitleKeyInvalid},
		"no X-Shop":   {post(t, s, key("o-t"), `{}`), idempotency.TitleTenantInvalid},
	} {
		if c.r.status != 400 || title(c.r) != c.title {
			t.Errorf("%s: %d %s", name, c.r.status, c.r.body)
		}
	}
	if idempotency.TitleKeyRequired != "An Idempotency-Key header is required" ||
		idempotency.TitleInProgress != "A request with this Idempotency-Key is still being processed" ||
		idempotency.TitleMismatch != "This Idempotency-Key was used for a different request" {
		t.Error("the titles are not the three packages'")
	}
	postStatus(t, s, "o-mm", 201)
	if r := post(t, s, key("o-mm"), `{"n": 2}`, "X-Shop", tenant, "X-Status", "201"); r.status != 422 || title(r) != idempotency.TitleMismatch {
		t.Errorf("422: %d %s", r.status, r.body)
	}
}

func TestPerRequestTTLReplayedHeadersAndHook(t *testing.T) {
	needDB(t)
	s := optionsServer(t, idempotency.Config{PerRequest: func(r *http.Request) idempotency.Intervals {
		return idempotency.Intervals{TTL: r.Header.Get("X-Ttl")}
	}})
	hooks = nil
	first := postStatus(t, s, "o-1", 201, "X-Ttl", "3 days")
	again := postStatus(t, s, "o-1", 201, "X-Ttl", "3 days")
	var ttl int
	if err := db.QueryRow(`SELECT extract(epoch FROM ttl)::int FROM idempotency_records WHERE tenant_id = $1 AND key = 'o-1'`,
		tenant).Scan(&ttl); err != nil || ttl != 3*86400 {
		t.Errorf("PerRequest's TTL: %d %v", ttl, err)
	}
	for _, r := range []reply{first, again} {
		if r.header.Get("Location") != "/things/o-1" || r.header.Get("X-Trace") != "" {
			t.Errorf("the first answer and the replay carry Location, not X-Trace: %v", r.header)
		}
	}
	if again.header.Get("Idempotent-Replayed") != "true" || fmt.Sprint(hooks) != "[false true]" ||
		first.header.Get("X-Hook") != "first" || again.header.Get("X-Hook") != "replay" {
		t.Errorf("ResponseHook: %v %v %v", hooks, first.header, again.header)
	}
}

func TestStoreStatus(t *testing.T) {
	needDB(t)
	s := optionsServer(t, idempotency.Config{})
	for status, want := range map[int]string{422: "failed", 409: "", 503: ""} {
		k := fmt.Sprintf("o-%d", status)
		hooked := len(hooks)
		r1, r2 := postStatus(t, s, k, status), postStatus(t, s, k, status)
		if want := map[bool]string{true: "[false true]", false: "[]"}[want != ""]; fmt.Sprint(hooks[hooked:]) != want {
			t.Errorf("%d: ResponseHook saw %v, want %s (none for an answer not stored)", status, hooks[hooked:], want)
		}
		got, _, _ := record(t, k)
		replayed := r2.header.Get("Idempotent-Replayed") == "true"
		if r1.status != status || r2.status != status || got != want || replayed != (want != "") ||
			(want == "" && writes(t, tenant, k) != 0) {
			t.Errorf("%d: %d %d record %q replayed %v rows %d", status, r1.status, r2.status, got, replayed, writes(t, tenant, k))
		}
	}
	only := optionsServer(t, idempotency.Config{StoreStatus: func(s int) bool { return s/100 == 2 },
		ReplayedHeaders: []string{"X-Trace"}})
	postStatus(t, only, "o-only-422", 422)
	if got, _, _ := record(t, "o-only-422"); got != "" {
		t.Errorf("StoreStatus 2xx only stored a 422: %q", got)
	}
	postStatus(t, only, "o-only-201", 201)
	again := postStatus(t, only, "o-only-201", 201)
	if again.header.Get("X-Trace") != "trace-o-only-201" || again.header.Get("Location") != "" {
		t.Errorf("ReplayedHeaders X-Trace: %v", again.header)
	}
}

// Retry-After (docs/integrations.md): the lease left of a committed claim,
// else the call's wait or 1; between RetryAfterMin and RetryAfterMax (1, 60).
func TestRetryAfterAndWait(t *testing.T) {
	needDB(t)
	if idempotency.RetryAfterMin != 1 || idempotency.RetryAfterMax != 60 {
		t.Errorf("RetryAfterMin, RetryAfterMax: %d, %d", idempotency.RetryAfterMin, idempotency.RetryAfterMax)
	}
	s := optionsServer(t, idempotency.Config{Lease: "40 seconds"})
	holder := asTenant(t)
	if _, err := holder.Exec(`SELECT idem_claim($1, 'o-busy', lease => '20 seconds')`, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(`SELECT idem_claim($1, 'o-busy-long', lease => '10 minutes')`, tenant); err != nil {
		t.Fatal(err)
	}
	if err := holder.Commit(); err != nil { // committed claims: their lease ends are known
		t.Fatal(err)
	}
	r := postStatus(t, s, "o-busy", 201)
	if after, _ := strconv.Atoi(r.header.Get("Retry-After")); r.status != 409 || title(r) != idempotency.TitleInProgress ||
		after < 18 || after > 20 {
		t.Errorf("409 with the lease left (<= 20 s): %d %v", r.status, r.header)
	}
	if r := postStatus(t, s, "o-busy-long", 201); r.status != 409 || r.header.Get("Retry-After") != "60" {
		t.Errorf("a 10-minute lease left: Retry-After capped at 60: %d %v", r.status, r.header)
	}
	holder = asTenant(t)
	defer func() { _ = holder.Rollback() }()
	if _, err := holder.Exec(`SELECT idem_claim($1, 'o-busy-2')`, tenant); err != nil {
		t.Fatal(err)
	}
	if r := postStatus(t, s, "o-busy-2", 201); r.status != 409 || r.header.Get("Retry-After") != "1" {
		t.Errorf("an uncommitted holder, no wait: 1 (not the Config's 40 s lease): %d %v", r.status, r.header)
	}
	brief := optionsServer(t, idempotency.Config{Wait: "1.2 seconds"})
	started := time.Now()
	if r := postStatus(t, brief, "o-busy-2", 201); r.status != 409 || r.header.Get("Retry-After") != "2" ||
		time.Since(started) < 1150*time.Millisecond {
		t.Errorf("after waiting 1.2 s for an uncommitted holder: the wait, rounded up (2): %d %v after %v",
			r.status, r.header, time.Since(started))
	}
	_ = holder.Rollback()

	waiting := optionsServer(t, idempotency.Config{Wait: "5 seconds"})
	completeLater(t, "o-wait", `{"status": 201, "body": {"by": "holder"}}`)
	r = postStatus(t, waiting, "o-wait", 201)
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != `{"by": "holder"}` {
		t.Errorf("Wait: the duplicate gets the original's answer: %d %v %s", r.status, r.header, r.body)
	}
}

func TestBeforeClaim(t *testing.T) {
	needDB(t)
	var seen string
	s := optionsServer(t, idempotency.Config{BeforeClaim: func(ctx context.Context, tx *sql.Tx, tenantID string) error {
		seen = tenantID
		_, err := tx.ExecContext(ctx, `SELECT set_config('app.request_tenant', $1, true)`, tenantID)
		return err
	}})
	if r := postStatus(t, s, "o-hook", 201); r.status != 201 || seen != tenant {
		t.Errorf("BeforeClaim ran with the tenant: %d %q", r.status, seen)
	}
	failing := optionsServer(t, idempotency.Config{BeforeClaim: func(context.Context, *sql.Tx, string) error {
		return errors.New("no such tenant")
	}})
	if r := postStatus(t, failing, "o-hook-fails", 201); r.status != 500 || writes(t, tenant, "o-hook-fails") != 0 {
		t.Errorf("a failing BeforeClaim answers 500 and runs nothing: %d", r.status)
	}
}

func TestRun(t *testing.T) {
	needDB(t)
	ctx := context.Background()
	opts := idempotency.RunOptions{TenantSetting: tenantSetting, Fingerprint: "fp-1",
		Intervals: idempotency.Intervals{TTL: "2 days"}}
	runs := 0
	book := func(tx *sql.Tx) (json.RawMessage, error) {
		runs++
		if _, err := tx.Exec(`INSERT INTO test_writes (tenant, key) VALUES ($1, 'r-1')`, tenant); err != nil {
			return nil, err
		}
		return json.RawMessage(`{"zeta":1,"alpha":2}`), nil
	}
	first, replayed1, err1 := idempotency.Run(ctx, appDB, tenant, "r-1", book, opts)
	again, replayed2, err2 := idempotency.Run(ctx, appDB, tenant, "r-1", book, opts)
	if err1 != nil || err2 != nil || replayed1 || !replayed2 || runs != 1 || string(first) != string(again) ||
		string(first) != `{"zeta": 1, "alpha": 2}` || writes(t, tenant, "r-1") != 1 {
		t.Fatalf("Run: %s %v %v / %s %v %v, %d runs", first, replayed1, err1, again, replayed2, err2, runs)
	}
	var ttl int
	_ = db.QueryRow(`SELECT extract(epoch FROM ttl)::int FROM idempotency_records WHERE tenant_id = $1 AND key = 'r-1'`,
		tenant).Scan(&ttl)
	if ttl != 2*86400 {
		t.Errorf("RunOptions' TTL: %d", ttl)
	}
	other := opts
	other.Fingerprint = "fp-2"
	if _, _, err := idempotency.Run(ctx, appDB, tenant, "r-1", book, other); !errors.Is(err, idempotency.ErrMismatch) {
		t.Errorf("another fingerprint: %v", err)
	}
	failing := func(tx *sql.Tx) (json.RawMessage, error) {
		_, _ = tx.Exec(`INSERT INTO test_writes (tenant, key) VALUES ($1, 'r-2')`, tenant)
		return nil, errors.New("the booking failed")
	}
	if _, _, err := idempotency.Run(ctx, appDB, tenant, "r-2", failing, opts); err == nil || writes(t, tenant, "r-2") != 0 {
		t.Errorf("fn fails: its write and the claim roll back: %v", err)
	}
	if got, _, _ := record(t, "r-2"); got != "" {
		t.Errorf("fn fails: nothing stored: %q", got)
	}
	holder := asTenant(t)
	defer func() { _ = holder.Rollback() }()
	if _, err := holder.Exec(`SELECT idem_claim($1, 'r-busy-long', lease => '10 minutes')`, tenant); err != nil {
		t.Fatal(err)
	}
	if err := holder.Commit(); err != nil { // its lease end is known
		t.Fatal(err)
	}
	var busy *idempotency.InProgressError
	_, _, err := idempotency.Run(ctx, appDB, tenant, "r-busy-long", book, idempotency.RunOptions{TenantSetting: tenantSetting})
	if !errors.Is(err, idempotency.ErrInProgress) || !errors.As(err, &busy) || busy.RetryAfter != 60*time.Second {
		t.Errorf("in progress (a committed claim's 10-minute lease left: capped at 60 s): %v", err)
	}
	holder = asTenant(t)
	if _, err := holder.Exec(`SELECT idem_claim($1, 'r-busy', lease => '30 seconds')`, tenant); err != nil {
		t.Fatal(err)
	}
	_, _, err = idempotency.Run(ctx, appDB, tenant, "r-busy", book, opts)
	if !errors.Is(err, idempotency.ErrInProgress) || !errors.As(err, &busy) || busy.RetryAfter != time.Second {
		t.Errorf("in progress (an uncommitted holder, no wait: 1 s, not its 30-second lease): %v", err)
	}
	brief := opts
	brief.Wait = "1.2 seconds"
	_, _, err = idempotency.Run(ctx, appDB, tenant, "r-busy", book, brief)
	if !errors.As(err, &busy) || busy.RetryAfter != 2*time.Second {
		t.Errorf("in progress after waiting 1.2 s: the wait, rounded up (2 s): %v", err)
	}
	_ = holder.Rollback()
	waiting := opts
	waiting.Wait = "5 seconds"
	completeLater(t, "r-wait", `{"by": "holder"}`)
	before := runs
	if out, replayed, err := idempotency.Run(ctx, appDB, tenant, "r-wait", book, waiting); err != nil || !replayed ||
		string(out) != `{"by": "holder"}` || runs != before {
		t.Errorf("Wait: a duplicate during the first delivery gets its result: %s %v %v", out, replayed, err)
	}
	if _, _, err := idempotency.Run(ctx, appDB, tenant, "", book, opts); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Errorf("an empty key: %v", err)
	}
	optional := opts
	optional.OptionalKey = true
	before = runs
	if _, replayed, err := idempotency.Run(ctx, appDB, tenant, "", book, optional); err != nil || replayed || runs != before+1 {
		t.Errorf("OptionalKey: an empty key runs fn without a claim: %v %d", err, runs)
	}
}

// claimHeld claims k as this run's tenant for holder, with a 10-minute lease
// and fingerprint (NULL when empty), and commits: an execution suspended
// mid-way, its claim live.  It returns the token.
func claimHeld(t *testing.T, k, fingerprint, holder string) int64 {
	t.Helper()
	tx := asTenant(t)
	var token int64
	err := tx.QueryRow(`SELECT token FROM idem_claim($1, $2, $3, lease => '10 minutes', holder => $4)`,
		tenant, k, sql.NullString{String: fingerprint, Valid: fingerprint != ""}, holder).Scan(&token)
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// RunOptions.Holder (extension 1.4): the same holder re-enters its committed
// claim with the record's token; another holder and none get ErrInProgress;
// no holder is 1.3's call, storing none.
func TestRunHolder(t *testing.T) {
	needDB(t)
	ctx := context.Background()
	token := claimHeld(t, "h-run", "", "exec-1")
	var seen []string
	step := func(tx *sql.Tx) (json.RawMessage, error) {
		var tok int64
		var holder sql.NullString
		if err := tx.QueryRow(`SELECT token, holder FROM idem_lookup($1, 'h-run')`, tenant).Scan(&tok, &holder); err != nil {
			return nil, err
		}
		seen = append(seen, fmt.Sprintf("%d %s", tok, holder.String))
		return json.RawMessage(`{"done": true}`), nil
	}
	for _, holder := range []string{"exec-2", ""} {
		_, _, err := idempotency.Run(ctx, appDB, tenant, "h-run", step, idempotency.RunOptions{Holder: holder, TenantSetting: tenantSetting})
		if !errors.Is(err, idempotency.ErrInProgress) {
			t.Errorf("holder %q: %v, want ErrInProgress", holder, err)
		}
	}
	out, replayed, err := idempotency.Run(ctx, appDB, tenant, "h-run", step, idempotency.RunOptions{Holder: "exec-1", TenantSetting: tenantSetting})
	if err != nil || replayed || string(out) != `{"done": true}` || len(seen) != 1 || seen[0] != fmt.Sprintf("%d exec-1", token) {
		t.Fatalf("the same holder: %s %v %v, seen %v (token %d)", out, replayed, err, seen, token)
	}
	if status, tok, _ := record(t, "h-run"); status != "completed" || tok != token {
		t.Errorf("record after re-entry: %s %d, want completed %d", status, tok, token)
	}
	if _, replayed, err := idempotency.Run(ctx, appDB, tenant, "h-run", step,
		idempotency.RunOptions{Holder: "exec-2", TenantSetting: tenantSetting}); err != nil || !replayed {
		t.Errorf("another holder after completion: replayed %v, %v", replayed, err)
	}
	var holder sql.NullString
	if _, _, err := idempotency.Run(ctx, appDB, tenant, "h-run-none", step,
		idempotency.RunOptions{TenantSetting: tenantSetting}); err != nil {
		t.Fatal(err)
	} else if err := db.QueryRow(`SELECT holder FROM idem_lookup($1, 'h-run-none')`, tenant).Scan(&holder); err != nil || holder.Valid {
		t.Errorf("no holder: stored %v, %v", holder, err)
	}
}

// Config.Holder: the middleware passes the request's holder the same way.
func TestMiddlewareHolder(t *testing.T) {
	needDB(t)
	s := optionsServer(t, idempotency.Config{Holder: func(r *http.Request) string { return r.Header.Get("X-Execution") }})
	body := `{"n": 1}`
	token := claimHeld(t, "h-mw", idempotency.Fingerprint(http.MethodPost, "/things", []byte(body)), "exec-1")
	for _, holder := range []string{"exec-2", ""} {
		if r := post(t, s, key("h-mw"), body, "X-Shop", tenant, "X-Status", "201", "X-Execution", holder); r.status != 409 {
			t.Errorf("holder %q: %d %s, want 409", holder, r.status, r.body)
		}
	}
	r := post(t, s, key("h-mw"), body, "X-Shop", tenant, "X-Status", "201", "X-Execution", "exec-1")
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the same holder: %d %v %s", r.status, r.header, r.body)
	}
	if status, tok, _ := record(t, "h-mw"); status != "completed" || tok != token {
		t.Errorf("record after re-entry: %s %d, want completed %d", status, tok, token)
	}
	if r := post(t, s, key("h-mw"), body, "X-Shop", tenant, "X-Status", "201", "X-Execution", "exec-2"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("another holder after completion: %d %v", r.status, r.header)
	}
}
