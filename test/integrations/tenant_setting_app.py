"""examples/fastapi/app.py with tenant_setting: the contract's isolation
pass (contract.py) runs the example app through this module,

    uvicorn tenant_setting_app:app --app-dir test/integrations

with LEDGER_EXAMPLE_DIR (the example's directory) and LEDGER_TENANT_SETTING
(e.g. app.tenant) in the environment.  Every Idempotency the app makes gets
tenant_setting=LEDGER_TENANT_SETTING through the package's own constructor
(so it is checked as the app's own argument would be); nothing else of the
app changes.
"""
import os
import sys

import idempotency_pg.fastapi as package


class Idempotency(package.Idempotency):
    def __init__(self, pool, **options):
        options.setdefault("tenant_setting", os.environ["LEDGER_TENANT_SETTING"])
        super().__init__(pool, **options)


package.Idempotency = Idempotency
sys.path.insert(0, os.environ["LEDGER_EXAMPLE_DIR"])
from app import app  # noqa: E402,F401  (the example, which imports Idempotency from the package now)
