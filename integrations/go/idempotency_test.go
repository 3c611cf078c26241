package idempotency_test

// The middleware against a real server: the PG* environment variables name a
// database where this user may CREATE EXTENSION idempotency (test/suites/79-go
// starts a throwaway one).  Without PGDATABASE only the tests that need no
// database run.
//
// IDEM_TEST_APP_USER: the role the middleware connects as (default PGUSER);
// test/suites/79-go gives it exactly the application role's grants of
// docs/privileges.md.  The checks read what was written as PGUSER.
// IDEM_TEST_TENANT_SETTING (e.g. app.tenant): tenant isolation is switched on
// with it and every middleware under test gets it as TenantSetting; unset,
// isolation is switched off.

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v4/stdlib"

	"github.com/idempotency-pg/idempotency/integrations/go"
)

var (
	db            *sql.DB // PGUSER: what the checks read the tables with
	appDB         *sql.DB // IDEM_TEST_APP_USER: what the middleware under test uses
	appUser       = os.Getenv("IDEM_TEST_APP_USER")
	tenantSetting = os.Getenv("IDEM_TEST_TENANT_SETTING")
	tenant        string // this run's tenant: the tests can run again on the same database

	mu         sync.Mutex
	executions = map[string]int{} // key -> how many times the handler ran
	tokens     []int64
)

func TestMain(m *testing.M) {
	if os.Getenv("PGDATABASE") != "" {
		var err error
		if db, err = sql.Open("pgx", ""); err != nil {
			log.Fatalf("The database settings are invalid: %v", err)
		}
		db.SetMaxOpenConns(30)
		appDB = db
		if appUser != "" {
			if appDB, err = sql.Open("pgx", "user="+appUser); err != nil {
				log.Fatalf("The database settings are invalid: %v", err)
			}
			appDB.SetMaxOpenConns(30)
		}
		grant := `SELECT 1`
		if appUser != "" {
			grant = `GRANT SELECT, INSERT ON test_writes TO "` + strings.ReplaceAll(appUser, `"`, `""`) + `"`
		}
		for _, stmt := range []string{
			`SELECT pg_advisory_lock(79)`,
			// the C extension, unless the API is there already (the SQL edition's plain script: 36-sql-edition)
			`DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'idem_claim' AND pg_function_is_visible(oid)) THEN CREATE EXTENSION IF NOT EXISTS idempotency; END IF; END$$`,
			`CREATE TABLE IF NOT EXISTS test_writes (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			   tenant text NOT NULL, key text NOT NULL, note text)`,
			// tokens beyond 2^53, where a float64 would round them (extension 1.1 hands them out from this sequence)
			`SELECT setval(seq, greatest(nextval(seq), 9223372032559808512))
			   FROM (SELECT to_regclass('idempotency_tokens') AS seq) s WHERE seq IS NOT NULL`,
			grant,
			`SELECT pg_advisory_unlock(79)`,
		} {
			if _, err := db.Exec(stmt); err != nil {
				log.Fatalf("Setting up the test database failed: %v", err)
			}
		}
		isolation := `SELECT idem_set_tenant_isolation(false)`
		if tenantSetting != "" {
			isolation = `SELECT idem_set_tenant_isolation(true, $1)`
		}
		if _, err := db.Exec(isolation, nonEmpty(tenantSetting)...); err != nil {
			log.Fatalf("Switching tenant isolation failed: %v", err)
		}
		suffix := make([]byte, 4)
		_, _ = rand.Read(suffix)
		tenant = "shop-" + hex.EncodeToString(suffix)
	}
	os.Exit(m.Run())
}

// nonEmpty is the query arguments: value, or none when it is empty.
func nonEmpty(value string) []any {
	if value == "" {
		return nil
	}
	return []any{value}
}

func needDB(t *testing.T) {
	t.Helper()
	if db == nil {
		t.Skip("set PGHOST, PGPORT, PGDATABASE and PGUSER to a database where this user may CREATE EXTENSION idempotency")
	}
}

// handler writes a row in the claim's transaction and answers as the request's headers ask.
func handler(w http.ResponseWriter, r *http.Request) {
	claim, claimed := idempotency.FromContext(r.Context())
	key := "(none)"
	if claimed {
		key = claim.Key
	}
	mu.Lock()
	executions[key]++
	if claimed {
		tokens = append(tokens, claim.Token)
	}
	mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	var id int64
	var err error
	if claimed {
		err = claim.Tx.QueryRowContext(r.Context(),
			`INSERT INTO test_writes (tenant, key, note) VALUES ($1, $2, $3) RETURNING id`,
			claim.Tenant, key, string(body)).Scan(&id)
	} else { // no key under OptionalKey: no claim, the handler uses the database itself
		err = db.QueryRowContext(r.Context(),
			`INSERT INTO test_writes (tenant, key, note) VALUES ($1, $2, $3) RETURNING id`,
			"nobody-"+tenant, key, string(body)).Scan(&id)
	}
	if err != nil {
		panic(err)
	}
	if ms, _ := strconv.Atoi(r.Header.Get("X-Delay-Ms")); ms > 0 {
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
	switch {
	case r.Header.Get("X-Panic") != "":
		panic("the handler failed after its write")
	case r.Header.Get("X-Answer-503") != "":
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "try later")
		return
	case strings.Contains(string(body), "refuse"):
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"error":"refused","id":%d}`, id)
		return
	}
	// key order and spacing jsonb will not keep: the answer sent is what PostgreSQL stored
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"zeta":1, "id":%d, "alpha":[1,2,{"b":2,"a":1}], "big": 12345678901234567890}`, id)
}

// server runs handler behind the middleware as the application role, with
// this run's TenantSetting.
func server(t *testing.T, cfg idempotency.Config) *httptest.Server {
	t.Helper()
	cfg.TenantSetting = tenantSetting
	cfg.Logger = log.New(io.Discard, "", 0)
	return serverAsIs(t, cfg)
}

// serverAsIs is server without this run's TenantSetting and Logger.
func serverAsIs(t *testing.T, cfg idempotency.Config) *httptest.Server {
	t.Helper()
	cfg.DB = appDB
	s := httptest.NewServer(idempotency.Middleware(cfg)(http.HandlerFunc(handler)))
	t.Cleanup(s.Close)
	return s
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

// post sends body with the given Idempotency-Key values (none: no header) and extra headers.
func post(t *testing.T, s *httptest.Server, keys []string, body string, extra ...string) reply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/things", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Client-Id", tenant)
	for _, k := range keys {
		req.Header.Add("Idempotency-Key", k)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil { // Errorf, not Fatalf: post also runs on goroutines of its own
		t.Errorf("POST failed: %v", err)
		return reply{}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, data}
}

func key(k string) []string { return []string{k} }

func ran(k string) int {
	mu.Lock()
	defer mu.Unlock()
	return executions[k]
}

func writes(t *testing.T, tenantID, k string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM test_writes WHERE tenant = $1 AND key = $2`, tenantID, k).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// record returns the key's status, token and stored body as PostgreSQL prints it ("" when there is none).
func record(t *testing.T, k string) (status string, token int64, body string) {
	t.Helper()
	err := db.QueryRow(`SELECT status, token, coalesce(response->'body', response)::text
	                      FROM idempotency_records WHERE tenant_id = $1 AND key = $2`, tenant, k).Scan(&status, &token, &body)
	if err == sql.ErrNoRows {
		return "", 0, ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return status, token, body
}

func TestOnceAndByteIdenticalReplay(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{})
	first := post(t, s, key("g-once"), `{"n": 1}`)
	again := post(t, s, key("g-once"), `{"n": 1}`)
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first answer: %d %v", first.status, first.header)
	}
	if again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("the replay differs: %d %q vs %q", again.status, again.body, first.body)
	}
	if ran("g-once") != 1 || writes(t, tenant, "g-once") != 1 {
		t.Fatalf("ran %d times, %d rows", ran("g-once"), writes(t, tenant, "g-once"))
	}
	status, _, stored := record(t, "g-once")
	if status != "completed" || stored != string(first.body) {
		t.Fatalf("the first answer is not the stored jsonb as PostgreSQL prints it: %s %q vs %q", status, stored, first.body)
	}
	if !strings.Contains(string(first.body), "12345678901234567890") {
		t.Fatalf("a number beyond 2^64 lost digits: %s", first.body)
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{})
	const keys, duplicates = 5, 20
	replies := make([][]reply, keys)
	var wg sync.WaitGroup
	var lock sync.Mutex
	for k := 0; k < keys; k++ {
		for d := 0; d < duplicates; d++ {
			wg.Add(1)
			go func(k int) {
				defer wg.Done()
				r := post(t, s, key(fmt.Sprintf("g-dup-%d", k)), fmt.Sprintf(`{"n": %d}`, k), "X-Delay-Ms", "200")
				lock.Lock()
				replies[k] = append(replies[k], r)
				lock.Unlock()
			}(k)
		}
	}
	wg.Wait()
	conflicts := 0
	for k := 0; k < keys; k++ {
		name := fmt.Sprintf("g-dup-%d", k)
		var original *reply
		for i, r := range replies[k] {
			if r.status == 201 && r.header.Get("Idempotent-Replayed") == "" {
				if original != nil {
					t.Fatalf("%s: two originals", name)
				}
				original = &replies[k][i]
			}
		}
		if original == nil || ran(name) != 1 || writes(t, tenant, name) != 1 {
			t.Fatalf("%s: original %v, ran %d, rows %d", name, original != nil, ran(name), writes(t, tenant, name))
		}
		for _, r := range replies[k] {
			switch r.status {
			case 409:
				conflicts++
				// the holder has not committed its claim and there is no wait: 1 (not the server's 5-minute lease)
				if r.header.Get("Retry-After") != "1" || !strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
					t.Fatalf("a 409 without Retry-After: 1 or problem+json: %v", r.header)
				}
			case 201:
				if !bytes.Equal(r.body, original.body) {
					t.Fatalf("%s: a replay differs", name)
				}
			default:
				t.Fatalf("%s: unexpected status %d %s", name, r.status, r.body)
			}
		}
	}
	if conflicts == 0 {
		t.Fatal("no duplicate met the original in flight")
	}
}

func TestMismatch(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{})
	if r := post(t, s, key("g-mismatch"), `{"n": 1, "m": [1, 2]}`); r.status != 201 {
		t.Fatalf("first: %d", r.status)
	}
	if r := post(t, s, key("g-mismatch"), `{"n": 2, "m": [1, 2]}`); r.status != 422 ||
		!strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
		t.Fatalf("another body: %d %v", r.status, r.header)
	}
	if r := post(t, s, key("g-mismatch"), `{ "m" : [1,2], "n":1 }`); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the same JSON with other key order and spacing: %d", r.status)
	}
	if ran("g-mismatch") != 1 {
		t.Fatalf("ran %d times", ran("g-mismatch"))
	}
}

func TestBadKeys(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{})
	for name, keys := range map[string][]string{
		"missing": nil, "empty": key(""), "256 bytes": key(strings.Repeat("k", 256)), "not ASCII": key("caf\u00e9"),
		"an unterminated sf-string": key(`"open`), "two headers": {"two-a", "two-b"},
	} {
		if r := post(t, s, keys, `{"n": 1}`); r.status != 400 || !strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("%s: %d %s", name, r.status, r.body)
		}
	}
	if writes(t, tenant, "two-a") != 0 {
		t.Error("a refused request ran")
	}
	if r := post(t, s, key(strings.Repeat("k", 255)), `{"n": 1}`); r.status != 201 {
		t.Errorf("255 bytes: %d", r.status)
	}
	a := post(t, s, key(`"g-sf-\"quoted\""`), `{"n": 1}`)
	b := post(t, s, key(`g-sf-"quoted"`), `{"n": 1}`)
	if a.status != 201 || b.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(a.body, b.body) {
		t.Errorf("an sf-string key is the same key as its bare form: %d %d", a.status, b.status)
	}
}

func TestOptionalKey(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{OptionalKey: true})
	before := ran("(none)")
	a := post(t, s, nil, `{"n": "no key"}`)
	b := post(t, s, nil, `{"n": "no key"}`)
	if a.status != 201 || b.status != 201 || b.header.Get("Idempotent-Replayed") != "" || bytes.Equal(a.body, b.body) {
		t.Fatalf("without a key each request runs: %d %d %q %q", a.status, b.status, a.body, b.body)
	}
	if ran("(none)") != before+2 {
		t.Fatalf("ran %d times", ran("(none)")-before)
	}
	k1 := post(t, s, key("g-optional"), `{"n": 1}`)
	k2 := post(t, s, key("g-optional"), `{"n": 1}`)
	if k2.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(k1.body, k2.body) || ran("g-optional") != 1 {
		t.Fatal("with a key it is still idempotent")
	}
	if r := post(t, s, key(""), `{"n": 1}`); r.status != 400 {
		t.Fatalf("a present but empty key: %d", r.status)
	}
	strict := server(t, idempotency.Config{})
	if r := post(t, strict, nil, `{"n": 1}`); r.status != 400 {
		t.Fatalf("without OptionalKey a missing key is a 400: %d", r.status)
	}
}

func TestPanicRollsBackAndRunsAgain(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{})
	r := post(t, s, key("g-panic"), `{"n": 1}`, "X-Panic", "1")
	if status, _, _ := record(t, "g-panic"); r.status != 500 || writes(t, tenant, "g-panic") != 0 || status != "" {
		t.Fatalf("a panic: %d, %d rows, record %q", r.status, writes(t, tenant, "g-panic"), status)
	}
	retry := post(t, s, key("g-panic"), `{"n": 1}`)
	if retry.status != 201 || retry.header.Get("Idempotent-Replayed") != "" || ran("g-panic") != 2 || writes(t, tenant, "g-panic") != 1 {
		t.Fatalf("the retry: %d, ran %d, rows %d", retry.status, ran("g-panic"), writes(t, tenant, "g-panic"))
	}
}

func TestFiveHundredRollsBackAndRunsAgain(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{})
	r := post(t, s, key("g-503"), `{"n": 1}`, "X-Answer-503", "1")
	if status, _, _ := record(t, "g-503"); r.status != 503 || string(r.body) != "try later" || writes(t, tenant, "g-503") != 0 || status != "" {
		t.Fatalf("a 503: %d %q, %d rows, record %q", r.status, r.body, writes(t, tenant, "g-503"), status)
	}
	if retry := post(t, s, key("g-503"), `{"n": 1}`); retry.status != 201 || writes(t, tenant, "g-503") != 1 {
		t.Fatalf("the retry: %d", retry.status)
	}
}

func TestFourHundredIsStoredAndReplayed(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{})
	first := post(t, s, key("g-403"), `{"refuse": true}`)
	again := post(t, s, key("g-403"), `{"refuse": true}`)
	status, _, _ := record(t, "g-403")
	if first.status != 403 || again.status != 403 || again.header.Get("Idempotent-Replayed") != "true" ||
		!bytes.Equal(first.body, again.body) || status != "failed" || ran("g-403") != 1 {
		t.Fatalf("%d %d %q %s ran %d", first.status, again.status, status, again.body, ran("g-403"))
	}
}

func TestTokensExactBeyondFloat(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{})
	// an expired claim with a token above 2^53: the next request takes it over
	if _, err := db.Exec(`INSERT INTO idempotency_records (tenant_id, key, status, token, fingerprint,
	        lease_expires_at, expires_at, ttl, created_at, updated_at)
	        VALUES ($1, 'g-big', 'processing', 9007199254740994, NULL, now() - interval '1 min',
	                now() - interval '1 min', interval '1 day', now(), now())`, tenant); err != nil {
		t.Fatal(err)
	}
	if r := post(t, s, key("g-big"), `{"n": 1}`); r.status != 201 {
		t.Fatalf("the takeover: %d %s", r.status, r.body)
	}
	status, token, _ := record(t, "g-big")
	if status != "completed" || token <= 1<<53 || token == 9007199254740994 {
		t.Fatalf("record %s with token %d", status, token)
	}
	found := false
	mu.Lock()
	for _, seen := range tokens {
		found = found || seen == token
	}
	mu.Unlock()
	if !found {
		t.Fatalf("the stored token %d is not one the handler saw", token)
	}
}

func TestParseIdempotencyKey(t *testing.T) {
	for raw, want := range map[string]string{`abc`: "abc", ` abc `: "abc", `"a\"b\\c"`: `a"b\c`, `"x"`: "x"} {
		if got, err := idempotency.ParseIdempotencyKey([]string{raw}); err != nil || got != want {
			t.Errorf("%q: %q, %v", raw, got, err)
		}
	}
	for _, raw := range []string{``, `"`, `"a\x"`, `"a"b"`, strings.Repeat("k", 256), "tab\there"} {
		if _, err := idempotency.ParseIdempotencyKey([]string{raw}); err == nil {
			t.Errorf("%q was accepted", raw)
		}
	}
}

func TestCanonicalJSON(t *testing.T) {
	a := idempotency.CanonicalJSON([]byte(`{"b": [1, {"y": 2, "x": 1}], "a": "<&>"}`))
	b := idempotency.CanonicalJSON([]byte(`{"a":"<&>","b":[1,{"x":1,"y":2}]}`))
	if string(a) != string(b) || string(a) != `{"a":"<&>","b":[1,{"x":1,"y":2}]}` {
		t.Fatalf("%s vs %s", a, b)
	}
	if got := idempotency.CanonicalJSON([]byte("not json")); string(got) != "not json" {
		t.Fatalf("not JSON: %s", got)
	}
	if idempotency.Fingerprint("POST", "/a", []byte(`{"n":1}`)) == idempotency.Fingerprint("POST", "/a", []byte(`{"n":2}`)) {
		t.Fatal("two bodies, one fingerprint")
	}
	var doc map[string]any
	if err := json.Unmarshal(a, &doc); err != nil {
		t.Fatal(err)
	}
}

// The application role, as the suite sets it up, cannot bypass row-level security.
func TestAppRoleHasNoBypass(t *testing.T) {
	needDB(t)
	if appUser == "" {
		t.Skip("set IDEM_TEST_APP_USER to a role with the application grants of docs/privileges.md")
	}
	var super, bypass, owner, rls bool
	if err := appDB.QueryRow(`SELECT r.rolsuper, r.rolbypassrls, pg_has_role(current_user, c.relowner, 'MEMBER'),
	        c.relrowsecurity FROM pg_roles r, pg_class c
	        WHERE r.rolname = current_user AND c.oid = 'idempotency_records'::regclass`).Scan(&super, &bypass, &owner, &rls); err != nil {
		t.Fatal(err)
	}
	if super || bypass || owner || rls != (tenantSetting != "") {
		t.Fatalf("%s: superuser %v, bypassrls %v, owner %v; row-level security %v with IDEM_TEST_TENANT_SETTING %q",
			appUser, super, bypass, owner, rls, tenantSetting)
	}
}

// TenantSetting: the record carries its tenant; another tenant's session sees
// it only with isolation off.  Without TenantSetting, with isolation on, the
// claim is refused (a 500, SQLSTATE 55000 or 42501 in the log) and nothing is
// stored; with isolation off it runs.
func TestTenantSetting(t *testing.T) {
	needDB(t)
	s := server(t, idempotency.Config{})
	if r := post(t, s, key("g-iso"), `{"n": 1}`); r.status != 201 {
		t.Fatalf("with this run's TenantSetting: %d %s", r.status, r.body)
	}
	if status, _, _ := record(t, "g-iso"); status != "completed" {
		t.Fatalf("the record of the tenant: %q", status)
	}
	setting := tenantSetting
	if setting == "" {
		setting = "app.tenant"
	}
	seen := map[string]int{}
	for _, as := range []string{tenant, "other-" + tenant} {
		tx, err := appDB.Begin()
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if _, err = tx.Exec(`SELECT set_config($1, $2, true)`, setting, as); err == nil {
			err = tx.QueryRow(`SELECT count(*) FROM idempotency_records WHERE key = 'g-iso' AND tenant_id = $1`,
				tenant).Scan(&n)
		}
		_ = tx.Rollback()
		if err != nil {
			t.Fatal(err)
		}
		seen[as] = n
	}
	others := 1
	if tenantSetting != "" {
		others = 0
	}
	if seen[tenant] != 1 || seen["other-"+tenant] != others {
		t.Fatalf("sessions of the tenant and of another see %v (isolation %q)", seen, tenantSetting)
	}

	var logged bytes.Buffer
	unset := serverAsIs(t, idempotency.Config{Logger: log.New(&logged, "", 0)})
	r := post(t, unset, key("g-iso-unset"), `{"n": 1}`)
	status, _, _ := record(t, "g-iso-unset")
	if tenantSetting == "" {
		if r.status != 201 || status != "completed" {
			t.Fatalf("isolation off, without TenantSetting: %d %s, record %q", r.status, r.body, status)
		}
		return
	}
	refused := strings.Contains(logged.String(), "(SQLSTATE 55000)") || strings.Contains(logged.String(), "(SQLSTATE 42501)")
	if r.status != 500 || !refused || status != "" || writes(t, tenant, "g-iso-unset") != 0 {
		t.Fatalf("isolation on, without TenantSetting: %d, record %q, log %q", r.status, status, logged.String())
	}
}

// Under tenant isolation a claim without TenantSetting is refused naming the
// package's option (not the server's hint, a set_config by hand), with the
// SQLSTATE (55000) kept: Run's error, the middleware's log, and a
// TenantSetting naming another setting is told the one the policy reads.
// With isolation off all three run.
func TestTenantSettingNamed(t *testing.T) {
	needDB(t)
	ctx := context.Background()
	book := func(tx *sql.Tx) (json.RawMessage, error) { return json.RawMessage(`1`), nil }
	_, _, unset := idempotency.Run(ctx, appDB, tenant, "g-named-run", book)
	_, _, other := idempotency.Run(ctx, appDB, tenant, "g-named-other", book,
		idempotency.RunOptions{TenantSetting: "app.other_tenant"})
	var logged bytes.Buffer
	r := post(t, serverAsIs(t, idempotency.Config{Logger: log.New(&logged, "", 0)}), key("g-named"), `{"n": 1}`)
	if tenantSetting == "" {
		if unset != nil || other != nil || r.status != 201 {
			t.Fatalf("isolation off, without TenantSetting: %v, %v, %d %s", unset, other, r.status, r.body)
		}
		return
	}
	sqlState := func(err error) string {
		var coded interface{ SQLState() string }
		if errors.As(err, &coded) {
			return coded.SQLState()
		}
		return ""
	}
	if want := fmt.Sprintf("set RunOptions.TenantSetting to %q", tenantSetting); sqlState(unset) != "55000" ||
		!strings.Contains(fmt.Sprint(unset), want) || strings.Contains(fmt.Sprint(unset), "set_config") {
		t.Errorf("Run without TenantSetting: %v (SQLSTATE %q); want an error saying %q", unset, sqlState(unset), want)
	}
	if want := fmt.Sprintf(`its policy reads %q, but RunOptions.TenantSetting is "app.other_tenant"`,
		tenantSetting); sqlState(other) != "55000" || !strings.Contains(fmt.Sprint(other), want) {
		t.Errorf("Run with another setting's name: %v (SQLSTATE %q); want an error saying %q", other, sqlState(other), want)
	}
	if want := fmt.Sprintf("set Config.TenantSetting to %q", tenantSetting); r.status != 500 ||
		!strings.Contains(logged.String(), want) || !strings.Contains(logged.String(), "(SQLSTATE 55000)") {
		t.Errorf("the middleware without TenantSetting: %d, log %q; want it to say %q", r.status, logged.String(), want)
	}
}

// A TenantSetting that is not a custom setting's name is refused at start-up.
func TestTenantSettingChecked(t *testing.T) {
	for _, bad := range []string{"tenant", "app.", "app.x'); DROP TABLE test_writes; --", "1a.b"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("TenantSetting %q was accepted", bad)
				}
			}()
			idempotency.Middleware(idempotency.Config{DB: &sql.DB{}, TenantSetting: bad})
		}()
	}
	idempotency.Middleware(idempotency.Config{DB: &sql.DB{}, TenantSetting: "app.tenant"})
}
