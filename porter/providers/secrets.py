"""The last check before a prompt leaves porter: it carries no secret of the user's.

A prompt holds the diagnostics of earlier attempts, and those hold what the
compiler read for a candidate; a candidate once had nvcc echo the signing key
into them (31 of its 32 seed bytes in two attempts).  The compiler's sandbox and
porter/diagnostics.py keep that text out; this is the check behind both: a
prompt holding the signing key's seed (raw, hex or base64 at any alignment,
whole or any 12-byte run of it), a line of the key file, or an API key or
token from the environment (whole or any 16-character run) is not sent.
"""

from __future__ import annotations

import base64
import os
import re
from functools import lru_cache

from porter.providers.base import PromptRequest, ProviderError

SEED_RUN = 12  # bytes of the seed that may not appear together
TOKEN_RUN = 16  # characters of an API key that may not appear together
_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD)$", re.I)


def _runs(text: str, n: int) -> set[str]:
    return {text[i:i + n] for i in range(max(1, len(text) - n + 1))} if len(text) >= n else set()


def _seed_forms(seed: bytes) -> set[str]:
    """Every text form of any SEED_RUN bytes of the seed: hex, and base64 (standard and URL-safe) at
    the three alignments the seed can have inside a longer encoded blob (the key file)."""
    out = set()
    for i in range(len(seed) - SEED_RUN + 1):
        run = seed[i:i + SEED_RUN]
        out |= {run.hex(), run.hex().upper(), run.decode("latin-1")}
    for k in range(3):
        whole = len(seed[k:]) // 3 * 3  # only complete groups encode the same in any stream
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            out |= _runs(enc(seed[k:k + whole]).decode(), SEED_RUN * 4 // 3)
    return out


@lru_cache(maxsize=4)
def _signing_key_forms(path: str, mtime_ns: int) -> frozenset[str]:
    from cryptography.hazmat.primitives import serialization

    data = open(path, "rb").read()
    forms = {ln for ln in data.decode("latin-1").splitlines() if len(ln) >= 20 and "PRIVATE KEY" not in ln}
    try:
        key = serialization.load_ssh_private_key(data, password=None)
        seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())
        forms |= _seed_forms(seed)
    except (ValueError, TypeError):  # not a key we can read: its lines are what we know of it
        pass
    return frozenset(forms)


def secret_forms() -> dict[str, frozenset[str]]:
    """What may not be sent, by the name a refusal gives it."""
    from porter.records.signing import private_key_path

    out: dict[str, frozenset[str]] = {}
    key = private_key_path()
    try:
        out["the signing key"] = _signing_key_forms(str(key), key.stat().st_mtime_ns)
    except OSError:
        pass
    for name, value in os.environ.items():
        if _SECRET_NAME.search(name) and len(value) >= TOKEN_RUN:
            out[f"${name}"] = frozenset(_runs(value, TOKEN_RUN))
    return out


def refuse_secrets(req: PromptRequest) -> None:
    """ProviderError (one line, naming the secret, never quoting it) when the prompt carries one."""
    text = "\n".join((req.system or "", req.prompt or ""))
    for name, forms in secret_forms().items():
        if any(f in text for f in forms):
            raise ProviderError(f"prompt for {req.unit} (attempt {req.attempt}) not sent: it contains {name} "
                                "(a candidate's diagnostics carried it; see porter/diagnostics.py)")
