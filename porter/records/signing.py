"""Ledger signatures: one Ed25519 key pair per user, its public half in the workspace.

Why Ed25519 through `cryptography`: a reviewer must be able to check the
ledger with no secret at all (an HMAC cannot do that), verification must be
fast (status re-checks on every call), and the key must be usable by standard
tools. The private key is kept in OpenSSH format, so `ssh-keygen -l -f` prints
the same fingerprint porter prints, and the workspace's public key,
`ledger/signer.pub`, is an ordinary OpenSSH public-key line.

Where things live (never inside a workspace, never printed):

  $PORTER_HOME              default $XDG_CONFIG_HOME/porter or ~/.config/porter
  $PORTER_SIGNING_KEY       the private key file (default $PORTER_HOME/signing_key, mode 0600)
  $PORTER_HOME/trusted_keys fingerprints a reviewer pinned (`porter trust FP`), one a line;
                            $PORTER_TRUSTED_KEYS adds more (space or comma separated)

Each ledger record's `sig` is Ed25519(private, DOMAIN + its `hash`). `hash`
covers `prev`, which covers every byte of the line before (its `sig`
included), so one valid signature on the last record vouches for the whole
chain up to it; status checks that one and checks every record only when it
fails (to name the lines at fault).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from porter.records.durable import write_atomic
from porter.errors import PorterError

DOMAIN = b"porter-ledger-v1:"
WORKSPACE_KEY = "ledger/signer.pub"
HOME_ENV = "PORTER_HOME"
KEY_ENV = "PORTER_SIGNING_KEY"
TRUST_ENV = "PORTER_TRUSTED_KEYS"
_FP = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


def porter_home() -> Path:
    named = os.environ.get(HOME_ENV)
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "porter"


def private_key_path() -> Path:
    named = os.environ.get(KEY_ENV)
    return Path(named).expanduser() if named else porter_home() / "signing_key"


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False


def fingerprint(public: Ed25519PublicKey) -> str:
    """OpenSSH's fingerprint of the key (what `ssh-keygen -l -f` prints)."""
    blob = base64.b64decode(openssh_line(public).split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def openssh_line(public: Ed25519PublicKey) -> str:
    return public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def is_fingerprint(text: str) -> bool:
    return _FP.fullmatch(text or "") is not None


@dataclass
class Signer:
    """The private key that signs this user's ledger records."""

    private: Ed25519PrivateKey

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)

    def sign(self, rec_hash: str) -> str:
        return self.private.sign(DOMAIN + rec_hash.encode("ascii")).hex()


def verify(public: Ed25519PublicKey, rec_hash, sig) -> bool:
    if not isinstance(sig, str) or not isinstance(rec_hash, str) or len(sig) != 128:
        return False
    try:
        public.verify(bytes.fromhex(sig), DOMAIN + rec_hash.encode("ascii"))
        return True
    except (InvalidSignature, ValueError, UnicodeEncodeError):
        return False


def load_private(workspace: Path | None = None) -> Signer | None:
    """This user's signing key, or None when there is none. A key file inside the workspace is refused."""
    path = private_key_path()
    if not path.is_file():
        if os.environ.get(KEY_ENV):
            raise PorterError(f"{KEY_ENV}={os.environ[KEY_ENV]} does not exist")
        return None
    if workspace is not None and _inside(path, workspace):
        raise PorterError(f"signing key {path} is inside the workspace; keep it outside (anyone who can edit the ledger could read it)")
    try:
        key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise PorterError(f"cannot read signing key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise PorterError(f"signing key {path} is not an Ed25519 key")
    return Signer(key)


def create_private(workspace: Path | None = None) -> Signer:
    """This user's signing key, made (OpenSSH format, mode 0600) when there is none yet."""
    found = load_private(workspace)
    if found is not None:
        return found
    path = private_key_path()
    if workspace is not None and _inside(path, workspace):
        raise PorterError(f"signing key {path} would be inside the workspace; set {KEY_ENV} or {HOME_ENV} elsewhere")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    signer = Signer(key)
    (path.parent / (path.name + ".pub")).write_text(openssh_line(signer.public) + " porter\n")
    return signer


# ---- the workspace's public key ------------------------------------------------------


def workspace_key_path(workspace: Path) -> Path:
    return Path(workspace) / WORKSPACE_KEY


def load_workspace_key(workspace: Path) -> tuple[Ed25519PublicKey | None, str | None]:
    """(public key, problem): the key ledger/signer.pub names; (None, None) when there is none."""
    path = workspace_key_path(workspace)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{WORKSPACE_KEY} is unreadable: {exc.strerror}"
    try:
        key = serialization.load_ssh_public_key(text.strip().encode())
    except (ValueError, IndexError):
        return None, f"{WORKSPACE_KEY} is not an OpenSSH public key"
    if not isinstance(key, Ed25519PublicKey):
        return None, f"{WORKSPACE_KEY} is not an Ed25519 key"
    return key, None


def write_workspace_key(workspace: Path, signer: Signer) -> Path:
    path = workspace_key_path(workspace)
    write_atomic(path, (openssh_line(signer.public) + " porter-ledger\n").encode())
    return path


# What another machine or user must do to go on porting in a workspace signed by someone's key
# (reviewers need nothing: status checks signatures with ledger/signer.pub alone).
SECOND_MACHINE = (f"to port in this workspace from another machine or as another user, copy this key there "
                  f"(mode 0600) as $PORTER_HOME/signing_key or name it with {KEY_ENV}; reviewers need no key")


def signer_for(workspace: Path) -> Signer | None:
    """The signer for appends to this workspace's ledger: None for an unsigned (legacy) workspace;
    a PorterError (exit 3) when the workspace is signed and this user's key is absent or another key."""
    public, problem = load_workspace_key(workspace)
    if problem:
        raise PorterError(problem, exit_code=3)
    if public is None:
        return None
    signer = load_private(workspace)
    want = fingerprint(public)
    if signer is None:
        raise PorterError(f"this workspace's ledger is signed by {want}; no signing key here ({private_key_path()}): "
                          f"records written here could not be signed. Copy the key that signed it (its "
                          f"$PORTER_HOME/signing_key where the workspace was made) to {private_key_path()}, "
                          f"mode 0600, or set {KEY_ENV} to it", exit_code=3)
    if signer.fingerprint != want:
        raise PorterError(f"wrong key: this workspace's ledger is signed by {want}, your signing key "
                          f"({private_key_path()}) is {signer.fingerprint}. Set {KEY_ENV} to the key that "
                          f"signed it (`ssh-keygen -l -f KEY` prints its fingerprint)", exit_code=3)
    return signer


# ---- trust pins ------------------------------------------------------------------------


def trusted_path() -> Path:
    return porter_home() / "trusted_keys"


def trusted() -> set[str]:
    """Fingerprints this user pinned, from $PORTER_HOME/trusted_keys and $PORTER_TRUSTED_KEYS."""
    out = set(re.split(r"[\s,]+", os.environ.get(TRUST_ENV, "").strip())) - {""}
    try:
        out |= {ln.split("#", 1)[0].strip() for ln in trusted_path().read_text().splitlines()} - {""}
    except FileNotFoundError:
        pass
    return out


def trust(fp: str) -> bool:
    """Pin `fp`; False when it was pinned already."""
    if not is_fingerprint(fp):
        raise PorterError(f"{fp!r} is not a key fingerprint (SHA256: and 43 base64 characters, as `porter status` "
                          "or `ssh-keygen -l -f ledger/signer.pub` prints it)")
    if fp in trusted():
        return False
    path = trusted_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "a") as f:
        f.write(fp + "\n")
    return True
