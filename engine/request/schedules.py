"""The DSpark schedules a user can pick, by name, with what each verifies (the CLI's and the app's choices)."""
from __future__ import annotations

SCHEDULES = {"all": "verify every draft", "threshold": "cut at the first draft below a confidence",
             "auto": "DSpark Alg. 1: maximise expected tokens/s, or decode plainly while drafting does not pay "
                     "(profiles this machine once)"}
