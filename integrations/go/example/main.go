// Example service: POST /entries books a batch of ledger entries (a JSON
// array) at most once per (client, Idempotency-Key), on the idempotency
// middleware and pgx's database/sql driver.
//
//	PGHOST=127.0.0.1 PGDATABASE=ledger PGUSER=ledger_app PORT=8080 ./example
//
// The database comes from the standard PG* environment variables (or
// DATABASE_URL); LEDGER_POOL_SIZE (default 10) sets the connections;
// LEDGER_TENANT_SETTING (e.g. app.tenant) is the tenant isolation setting;
// LEDGER_TEST_HOOKS=1 (tests only) honours X-Test-Delay-Ms (a slow booking)
// and X-Test-Fail-After-Write (a failure after the inserts).  The schema is
// examples/fastapi/schema.sql, the same ledger service as the FastAPI and
// Express examples.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v4/stdlib" // the "pgx" database/sql driver

	"github.com/idempotency-pg/idempotency/integrations/go"
)

var (
	testHooks     = os.Getenv("LEDGER_TEST_HOOKS") == "1"
	accountFormat = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)
)

type entry struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

type booked struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// authenticatedClient says whose keys these are.  A stand-in for
// authentication: a real service returns the authenticated principal's id.
func authenticatedClient(r *http.Request) (string, error) {
	if client := r.Header.Get("X-Client-Id"); client != "" {
		return client, nil
	}
	return "default", nil
}

// problem answers an RFC 7807 problem document.
func problem(w http.ResponseWriter, status int, title, detail string) {
	text, _ := json.Marshal(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write(text)
}

// validEntries is a 400 before the claim: nothing is stored, the key may be
// reused with a corrected body.  It leaves the body for the next handler.
func validEntries(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err == nil {
			_, err = parseEntries(body)
		}
		if err != nil {
			problem(w, http.StatusBadRequest, "the request is invalid", err.Error())
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

func parseEntries(body []byte) ([]entry, error) {
	invalid := fmt.Errorf(`the body must be an array of 1 to 100 {"account": "a-z0-9-", "amount": cents > 0}`)
	decoder := json.NewDecoder(bytes.NewReader(body))
	decoder.UseNumber()
	var raw []map[string]any
	if err := decoder.Decode(&raw); err != nil || decoder.More() || len(raw) < 1 || len(raw) > 100 {
		return nil, invalid
	}
	entries := make([]entry, 0, len(raw))
	for _, e := range raw {
		account, _ := e["account"].(string)
		number, _ := e["amount"].(json.Number)
		amount, err := strconv.ParseInt(string(number), 10, 64)
		if !accountFormat.MatchString(account) || err != nil || amount <= 0 || amount > 1<<53-1 {
			return nil, invalid
		}
		entries = append(entries, entry{account, amount})
	}
	return entries, nil
}

// postEntries books the entries in the claim's transaction.
func postEntries(w http.ResponseWriter, r *http.Request) {
	claim, _ := idempotency.FromContext(r.Context())
	entries, _ := parseEntries(mustRead(r))
	var frozen []string
	for _, e := range entries {
		if strings.HasPrefix(e.Account, "frozen-") {
			frozen = append(frozen, e.Account)
		}
	}
	if len(frozen) > 0 { // a business failure: stored (idem_release with the failure) and replayed
		writeJSON(w, http.StatusForbidden, map[string]any{"error": map[string]any{"code": "account_frozen", "accounts": frozen}})
		return
	}
	result := make([]booked, 0, len(entries))
	for _, e := range entries {
		var id int64
		err := claim.Tx.QueryRowContext(r.Context(),
			`INSERT INTO ledger_entries (client_id, idempotency_key, account, amount)
			 VALUES ($1, $2, $3, $4) RETURNING id`, claim.Tenant, claim.Key, e.Account, e.Amount).Scan(&id)
		if err != nil {
			log.Printf("booking failed: %v", err)
			problem(w, http.StatusInternalServerError, "internal error", "Nothing was stored; retrying with the same key is safe.")
			return
		}
		result = append(result, booked{fmt.Sprintf("le_%d", id), e.Account, e.Amount})
	}
	if testHooks {
		if ms, err := strconv.Atoi(r.Header.Get("X-Test-Delay-Ms")); err == nil && ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		if r.Header.Get("X-Test-Fail-After-Write") != "" { // a 5xx: the middleware rolls the inserts back
			problem(w, http.StatusInternalServerError, "internal error", "Nothing was stored; retrying with the same key is safe.")
			return
		}
	}
	writeJSON(w, http.StatusCreated, result)
}

func mustRead(r *http.Request) []byte {
	body, _ := io.ReadAll(r.Body)
	return body
}

func writeJSON(w http.ResponseWriter, status int, value any) {
	text, _ := json.Marshal(value)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(text)
}

func main() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // empty: the PG* environment variables
	if err != nil {
		log.Fatalf("The database settings are invalid: %v", err)
	}
	poolSize := 10
	if n, err := strconv.Atoi(os.Getenv("LEDGER_POOL_SIZE")); err == nil && n > 0 {
		poolSize = n
	}
	db.SetMaxOpenConns(poolSize)
	db.SetMaxIdleConns(poolSize)

	// with tenant isolation on: LEDGER_TENANT_SETTING=app.tenant
	idempotent := idempotency.Middleware(idempotency.Config{DB: db, Tenant: authenticatedClient,
		TenantSetting: os.Getenv("LEDGER_TENANT_SETTING")})
	mux := http.NewServeMux()
	mux.Handle("/entries", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			problem(w, http.StatusMethodNotAllowed, "only POST is allowed here", "")
			return
		}
		validEntries(idempotent(http.HandlerFunc(postEntries))).ServeHTTP(w, r)
	}))

	host, port := os.Getenv("HOST"), os.Getenv("PORT")
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "8080"
	}
	server := &http.Server{Addr: net.JoinHostPort(host, port), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	listener, err := net.Listen("tcp", server.Addr)
	if err != nil {
		log.Fatalf("Cannot listen on %s: %v", server.Addr, err)
	}
	log.Printf("listening on http://%s/entries", listener.Addr())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	if err := server.Serve(listener); err != http.ErrServerClosed {
		log.Fatalf("The server stopped: %v", err)
	}
	_ = db.Close()
}
