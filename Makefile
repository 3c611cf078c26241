# idempotency: PGXS build.  `make`, `make install`, `make installcheck`
# (regression, isolation and TAP suites, each on a throwaway server that
# preloads the library).  test/run-all runs every suite from a fresh machine.

EXTENSION  = idempotency
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(EXTENSION).control)

MODULE_big = idempotency
OBJS       = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))

# Install scripts: idempotency--1.0.sql exactly as 1.0 shipped (never edit
# it) and one update script per later version.  There is no full script for
# the current version: CREATE EXTENSION installs 1.0 and runs the updates.
DATA = $(EXTENSION)--1.0.sql $(EXTENSION)--1.0--1.1.sql $(EXTENSION)--1.1--1.2.sql \
       $(EXTENSION)--1.2--1.3.sql $(EXTENSION)--1.3--1.4.sql

PG_CFLAGS = -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers

TEST_CONF = test/regress.conf

REGRESS      = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --temp-instance=tmp_check --temp-config=$(TEST_CONF)

ISOLATION      = $(patsubst test/isolation/specs/%.spec,%,$(sort $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --temp-instance=tmp_check_iso --temp-config=$(TEST_CONF)

TAP_TESTS   = 1
PROVE_TESTS = $(sort $(wildcard test/t/*.pl))

EXTRA_CLEAN = tmp_check tmp_check_iso output_iso results regression.diffs regression.out

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The TAP suite alone (installcheck runs it after the regression and
# isolation suites): make prove_installcheck [PROVE_TESTS=test/t/040_x.pl]
.PHONY: prove_installcheck
prove_installcheck:
	$(prove_installcheck)

# PGXS tracks no header dependencies: every object depends on the shared
# headers, so a changed struct never leaves a stale object behind.
$(OBJS): $(wildcard src/*.h)
