"""A prompt that carries the signing key or an API key is not sent (porter/providers/secrets.py)."""

import base64

import pytest
from cryptography.hazmat.primitives import serialization

from porter.records import signing
from porter.providers import PromptRequest, ProviderError, send
from porter.providers.base import Completion, Provider


class Counting(Provider):
    name = "counting"

    def __init__(self):
        self.calls = 0

    def complete(self, req):
        self.calls += 1
        return Completion(text="ok", provider=self.name, model="m")


def _req(prompt: str) -> PromptRequest:
    return PromptRequest(target="t", unit="u", attempt=2, system="system", prompt=prompt)


@pytest.fixture
def seed():
    signer = signing.create_private()  # under the test's own $PORTER_HOME (conftest)
    return signer.private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                        serialization.NoEncryption())


def _refused(prompt: str) -> str:
    p = Counting()
    with pytest.raises(ProviderError) as exc:
        send(p, _req(prompt))
    assert p.calls == 0, "the provider was called with a prompt carrying a secret"
    msg = str(exc.value)
    assert "\n" not in msg and "not sent" in msg
    return msg


def test_a_clean_prompt_is_sent(seed):
    p = Counting()
    assert send(p, _req("u.cu(3): error: expected a \";\"")).text == "ok" and p.calls == 1


def test_the_seed_in_hex_or_base64_at_any_alignment_is_refused(seed):
    assert "signing key" in _refused(f"diag: {seed.hex()}")
    assert "signing key" in _refused(f"diag: {seed[5:20].hex().upper()}")
    for k in range(3):  # 31 of the 32 bytes, inside a longer blob at each alignment
        blob = b"\x00" * k + b"junk" + seed[:31]
        assert "signing key" in _refused(f"diag: {base64.b64encode(blob).decode()}")


def test_a_line_of_the_key_file_is_refused(seed):
    line = signing.private_key_path().read_text().splitlines()[2]
    assert "signing key" in _refused(f"secret.txt(3): error: identifier \"{line}\" is undefined")


def test_an_api_key_from_the_environment_is_refused(seed, monkeypatch):
    key = "sk-ant-api03-" + "Zq8" * 20
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    msg = _refused(f"env dump: {key[10:40]}")
    assert "$ANTHROPIC_API_KEY" in msg and key[10:40] not in msg
