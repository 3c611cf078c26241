/*
 * child_key.c
 *		idem_child_key: a stable idempotency key for a downstream call.
 *
 * A multi-step handler calls other services (a card processor in step
 * "charge") and must send them the same Idempotency-Key on every retry and
 * after every takeover, or a resumed holder could charge twice.  The child
 * key is derived from (tenant_id, key, step) alone: "idem-" and the SHA-256
 * of the three, each preceded by its length in bytes so that no two triples
 * run together into the same input.  69 printable ASCII characters without
 * spaces, whatever the inputs: safe in an HTTP header, within the 255 bytes
 * a key may have.
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "utils/builtins.h"

#include "compat.h"
#include "idempotency.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(idem_child_key);

#define CHILD_KEY_PREFIX "idem-"

/* Feed one part, preceded by its length, to the hash. */
static void
hash_part(pg_cryptohash_ctx *ctx, const text *part)
{
	uint32		len = VARSIZE_ANY_EXHDR(part);
	uint8		len_bytes[4] = {len >> 24, len >> 16, len >> 8, len};

	if (pg_cryptohash_update(ctx, len_bytes, sizeof(len_bytes)) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) VARDATA_ANY(part), len) < 0)
		elog(ERROR, "could not compute the child key: %s", pg_cryptohash_error(ctx));
}

/*
 * idem_child_key(tenant_id, key, step) RETURNS text
 */
Datum
idem_child_key(PG_FUNCTION_ARGS)
{
	text	   *parts[3];
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	char		hex[PG_SHA256_DIGEST_LENGTH * 2 + 1];
	pg_cryptohash_ctx *ctx;

	parts[0] = idem_arg_identifier(fcinfo, 0, "tenant_id", true);
	parts[1] = idem_arg_identifier(fcinfo, 1, "key", true);
	parts[2] = idem_arg_identifier(fcinfo, 2, "step", true);

	ctx = pg_cryptohash_create(PG_SHA256);
	if (pg_cryptohash_init(ctx) < 0)
		elog(ERROR, "could not compute the child key: %s", pg_cryptohash_error(ctx));
	for (int i = 0; i < 3; i++)
		hash_part(ctx, parts[i]);
	if (pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
		elog(ERROR, "could not compute the child key: %s", pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);

	hex[hex_encode((const char *) digest, sizeof(digest), hex)] = '\0';
	PG_RETURN_TEXT_P(cstring_to_text(psprintf(CHILD_KEY_PREFIX "%s", hex)));
}
