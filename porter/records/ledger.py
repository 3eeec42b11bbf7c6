"""The ledger: an append-only, hash-chained, Ed25519-signed JSONL file (HMAC-keyed in old workspaces).

Every attempt, gate result, failure and verified/built step of a run is one
line of <workspace>/ledger/ledger.jsonl. A line is the canonical JSON of one
record (sorted keys, no spaces):

    seq   1, 2, 3, ... (the line number of an intact ledger)
    time  UTC ISO-8601
    kind  "attempt" | "gate" | "failure" | "step" | "exhausted" | "reconcile" | "usage" | "repair" | ...
    ...   the record's own fields, flat (unit, attempt, gate, ok, ...)
    prev  sha256 hex of the previous line's bytes (without its newline); "0"*64 for the first
    hash  sha256 hex of the canonical JSON of the record without `hash` and `hmac`
    sig   Ed25519 signature over DOMAIN + hash by the workspace's key (porter.records.signing)
    hmac  HMAC-SHA256(key, prev_hmac + hash) when a legacy key is set; prev_hmac is the
          previous record's hmac, or "0"*64 when it has none

`prev` ties each line to the exact bytes before it, so an edited, deleted,
inserted or reordered line breaks the chain. Anyone can recompute an unkeyed
chain after forging a line; the HMAC, keyed by a secret kept outside the
workspace, is what makes that detectable. `verify()` says which case holds.

Appends take an exclusive flock on the ledger file, so two writers (two
processes, or a cron run beside a manual one) never interleave, and each line
is written with a single write on an O_APPEND descriptor, then fsynced. A line
torn by a crash (no trailing newline, or an unreadable last line) is moved,
byte for byte, to ledger/torn-<time>.jsonl.part on the next append and a
"repair" record naming that file is appended: nothing is dropped silently. A
torn line is never completed into a record, even when its bytes hash right:
anyone can write such a line, and the next signed append would vouch for it.

A signed append first checks the line it chains onto (its hash and its
signature; an unsigned predecessor only while no record is signed yet) and
says so in the record (`prev_checked: true`). A reader therefore needs one
signature check for a run of such records: a valid signature on a record with
prev_checked vouches that its predecessor's signature verified when it was
written, and that predecessor's bytes are fixed by `prev`. Records without the
flag (older porter) have each predecessor's signature checked by the reader.
A line with a duplicated JSON member is tampered: two JSON readers may take
different values from it.

Verification uses json + hashlib only (about 30 us a record), because status
re-verifies the whole chain every time it runs.
"""

from __future__ import annotations

import fcntl
import hmac as hmac_mod
import json
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from porter.digest import sha256_bytes
from porter.records.durable import fsync_dir, read_regular
from porter.errors import PorterError

ZERO = "0" * 64
LEDGER_DIR = "ledger"
LEDGER_FILE = "ledger.jsonl"
TORN_GLOB = "torn-*.jsonl.part"
# Fields the ledger itself sets; a caller's field of the same name would be ambiguous.
RESERVED = frozenset({"seq", "time", "kind", "prev", "hash", "hmac", "sig", "prev_checked"})
UNHASHED = ("hash", "hmac", "sig")  # the fields `hash` is not computed over
KEY_ENV = "PORTER_LEDGER_KEY"
KEY_FILE_ENV = "PORTER_LEDGER_KEY_FILE"
DEFAULT_KEY_FILE = Path("~/.config/porter/ledger.key")
_FROM_WORKSPACE = object()
# Far above any real ledger (10k records are ~10 MB); a bound so a ledger or evidence path that is a
# device or a huge file is refused instead of read into memory.
LEDGER_MAX_BYTES = 1 << 30


class DuplicateMember(ValueError):
    pass


def _strict_object(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        raise DuplicateMember(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out


def loads_strict(line: bytes):
    """json.loads that refuses an object with a duplicated member (DuplicateMember, a ValueError)."""
    return json.loads(line, object_pairs_hook=_strict_object)


def canonical(obj) -> bytes:
    """The one byte encoding porter hashes: sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def record_hash(record: dict) -> str:
    """sha256 of the canonical JSON of `record` without its hash, hmac and sig."""
    body = {k: v for k, v in record.items() if k not in UNHASHED}
    return sha256_bytes(canonical(body))


def chain_hmac(key: bytes, prev_hmac: str, rec_hash: str) -> str:
    return hmac_mod.digest(key, (prev_hmac + rec_hash).encode("ascii"), "sha256").hex()


def _line_body(line: bytes, rec: dict) -> bytes | None:
    """The bytes `hash` was computed over, cut out of a canonical line without re-encoding it:
    the line minus its top-level "hash" and "hmac" members. None when that cannot be done
    unambiguously (then the caller re-encodes the parsed record)."""
    out = line
    for key in UNHASHED:
        if key not in rec:
            continue
        value = rec[key]
        if not isinstance(value, str) or len(value) not in (64, 128) or not value.isalnum() or not value.isascii():
            return None
        member = b'"' + key.encode() + b'":"' + value.encode() + b'"'
        i = out.find(member)
        if i <= 0 or out.find(member, i + 1) >= 0:
            return None
        j = i + len(member)
        if out[i - 1 : i] == b",":
            out = out[: i - 1] + out[j:]
        elif out[i - 1 : i] == b"{" and out[j : j + 1] == b",":
            out = out[:i] + out[j + 1 :]
        else:
            return None
    return out


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def load_key(workspace: Path) -> bytes | None:
    """The ledger HMAC key: $PORTER_LEDGER_KEY, else the file named by
    $PORTER_LEDGER_KEY_FILE, else ~/.config/porter/ledger.key; None when none is set.

    A key file inside the workspace is refused: whoever can rewrite the ledger
    could then read the key and re-sign a forged chain.
    """
    value = os.environ.get(KEY_ENV)
    if value:
        return value.encode("utf-8")
    named = os.environ.get(KEY_FILE_ENV)
    path = Path(named).expanduser() if named else DEFAULT_KEY_FILE.expanduser()
    if not path.is_file():
        if named:
            raise PorterError(f"{KEY_FILE_ENV}={named} does not exist")
        return None
    if _inside(path, Path(workspace)):
        raise PorterError(
            f"ledger key file {path} is inside the workspace; move it outside (anyone who can edit the ledger could read it)"
        )
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise PorterError(f"cannot read ledger key file {path}: {exc.strerror}") from exc
    if not key:
        raise PorterError(f"ledger key file {path} is empty")
    return key


@dataclass
class Integrity:
    """What verify() found. `ok` is False exactly when `problems` is non-empty."""

    ok: bool
    problems: list[str]
    keyed: bool  # every record from the first signed one on carries a valid HMAC under the key given
    records: int = 0  # readable records
    signed: int = 0  # records carrying an hmac field
    key_given: bool = False
    notes: list[str] = field(default_factory=list)  # not tampering: torn tail, unsigned prefix
    bad_lines: dict[int, str] = field(default_factory=dict)  # 1-based line -> problem
    first_signed_line: int | None = None
    fingerprint: str | None = None  # the Ed25519 key records were checked with (the workspace's)
    sig_signed: int = 0  # records carrying a sig
    first_sig_line: int | None = None
    torn: list[str] = field(default_factory=list)  # a torn tail: not a record, not tampering, not ok to leave

    def key_state(self) -> str:
        if self.fingerprint:
            frm = f" from line {self.first_sig_line}" if self.first_sig_line and self.first_sig_line > 1 else ""
            return f"signed{frm} (Ed25519 {self.fingerprint})"
        if self.key_given and self.records and self.signed == 0:
            return "UNKEYED (a key is set but no record is signed yet)"
        if self.key_given and self.first_signed_line and self.first_signed_line > 1:
            return f"HMAC-keyed from line {self.first_signed_line} (earlier lines predate the key, covered by the chain)"
        if self.key_given:
            return "HMAC-keyed"
        if self.signed:
            return "UNKEYED here (records carry HMACs but no key is available to check them)"
        return "UNKEYED (a forged line with a recomputed chain cannot be told apart; set PORTER_LEDGER_KEY)"

    def summary(self) -> str:
        head = f"ledger: {self.records} records"
        if not self.ok:
            more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            return f"{head}, TAMPERED: {self.problems[0]}{more}"
        return f"{head}, chain ok, {self.key_state()}"


@dataclass
class Scan:
    """One pass over the ledger: the readable records with their line numbers, and the verdict."""

    entries: list[tuple[int, dict]]
    integrity: Integrity
    data: bytes = b""  # the bytes read (status compares them with the committed ledger)


class Ledger:
    """<workspace>/ledger/ledger.jsonl. See the module docstring for the format."""

    def __init__(self, workspace: Path, key: bytes | None = None, signer=None, public=_FROM_WORKSPACE):
        """`key`: the legacy HMAC key; `signer`: a porter.records.signing.Signer that signs every append (and
        keeps the witness current); `public`: the Ed25519 key scan() verifies with (default: the
        workspace's ledger/signer.pub)."""
        self.workspace = Path(workspace)
        self.dir = self.workspace / LEDGER_DIR
        self.path = self.dir / LEDGER_FILE
        self.key = key
        self.signer = signer
        self._public = public
        self._witness = None
        self._first_hash: str | None = None
        self._recorded_torn: set[str] = set()  # torn files known to be named by a repair record

    @classmethod
    def open(cls, workspace: Path) -> "Ledger":
        """The ledger as a writer opens it: the HMAC key load_key() finds (or none), and this user's
        signing key when the workspace is signed (a missing or wrong key is a one-line error)."""
        from porter.records.signing import signer_for

        return cls(workspace, load_key(workspace), signer_for(workspace))

    @property
    def public(self):
        if self._public is _FROM_WORKSPACE:
            from porter.records.signing import load_workspace_key

            self._public = load_workspace_key(self.workspace)[0]
        return self._public

    # ---- appending -------------------------------------------------------

    @contextmanager
    def _locked(self):
        created = not self.path.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if created:
                fsync_dir(self.dir)
            yield fd
        finally:
            os.close(fd)  # releases the flock

    def append(self, kind: str, **fields) -> dict:
        """Append one record and return it (with seq, time, prev, hash, hmac)."""
        if not isinstance(kind, str) or not kind:
            raise ValueError("ledger record kind must be a non-empty string")
        clash = RESERVED.intersection(fields)
        if clash:
            raise ValueError(f"ledger fields {sorted(clash)} are set by the ledger itself")
        with self._locked() as fd:
            self._repair_locked(fd)
            return self._append_locked(fd, kind, fields)

    def _append_locked(self, fd: int, kind: str, fields: dict) -> dict:
        last_line = _last_line(fd)
        if self.signer is not None:
            self._check_predecessor(fd, last_line)
        if last_line is None:
            seq, prev, prev_hmac = 1, ZERO, ZERO
        else:
            last = json.loads(last_line)
            last_seq = last.get("seq") if isinstance(last, dict) else None
            seq = (last_seq if isinstance(last_seq, int) else 0) + 1
            prev = sha256_bytes(last_line)
            prev_hmac = (last.get("hmac") if isinstance(last, dict) else None) or ZERO
        record = {"seq": seq, "time": utc_now(), "kind": kind, **fields, "prev": prev}
        if self.signer is not None:
            record["prev_checked"] = True
        record["hash"] = sha256_bytes(canonical(record))
        if self.key is not None:
            record["hmac"] = chain_hmac(self.key, prev_hmac, record["hash"])
        if self.signer is not None:
            record["sig"] = self.signer.sign(record["hash"])
        line = canonical(record) + b"\n"
        _write_all(fd, line)
        os.fsync(fd)
        if self.signer is not None:
            self._witness_saw(fd, record)
        return record

    def _check_predecessor(self, fd: int, last_line: bytes | None) -> None:
        """Refuse to sign on top of a line this key did not sign: a signature on the new record would
        vouch (through `prev`) for whatever the line holds. An unsigned line is accepted only while
        no record is signed yet (a ledger from before signing)."""
        if last_line is None:
            return
        where = "the ledger's last line"
        try:
            last = loads_strict(last_line)
        except ValueError as exc:
            raise PorterError(f"{where} is not a ledger record ({exc}); see `porter status`", exit_code=3) from exc
        if not isinstance(last, dict):
            raise PorterError(f"{where} is not a ledger record; see `porter status`", exit_code=3)
        where = f"ledger record seq {last.get('seq')}"
        body = _line_body(last_line, last)
        if last.get("hash") != (sha256_bytes(body) if body is not None else record_hash(last)):
            raise PorterError(f"{where} was edited (hash mismatch): not signing on top of it; see `porter status`",
                              exit_code=3)
        if last.get("sig") is None:
            if b'"sig":"' in os.pread(fd, os.fstat(fd).st_size, 0):
                raise PorterError(f"{where} is unsigned after signed records: not signing on top of it; "
                                  "`porter repair --reason TEXT` moves it aside", exit_code=3)
            return
        from porter.records import signing

        if not signing.verify(self.signer.public, last.get("hash"), last.get("sig")):
            raise PorterError(f"{where}'s signature does not verify with this workspace's key {self.signer.fingerprint} "
                              "(forged?): not signing on top of it; `porter repair --reason TEXT` moves it aside",
                              exit_code=3)

    def _witness_saw(self, fd: int, record: dict) -> None:
        from porter.records import witness

        if self._witness is None:
            self._witness = witness.Writer(self.workspace, self.signer.fingerprint)
        if self._first_hash is None:
            first = os.pread(fd, 4096, 0)
            while b"\n" not in first and len(first) < os.fstat(fd).st_size:
                first = os.pread(fd, len(first) * 2, 0)
            self._first_hash = json.loads(first.split(b"\n", 1)[0]).get("hash")
        self._witness.saw(record, self._first_hash)

    def reset_witness(self) -> None:
        """Make the witness the ledger as it is now (`porter repair`, after accepting a loss)."""
        from porter.records import witness

        if self.signer is None:
            return
        self._first_hash = None
        self._witness = witness.Writer(self.workspace, self.signer.fingerprint)
        self._witness.reset(self.scan().entries)

    # ---- torn tail ---------------------------------------------------------

    def repair_torn_tail(self) -> bool:
        """Move a torn last line aside and record a "repair"; True when something was repaired."""
        if not self.path.exists():
            return False
        with self._locked() as fd:
            return self._repair_locked(fd)

    def _repair_locked(self, fd: int) -> bool:
        repaired = False
        size = os.fstat(fd).st_size
        if size:
            good_end, torn = _torn_tail(fd, size)
            if torn is not None:
                repaired = True
                # A torn line is moved aside even when its bytes hash right: completing it would
                # let a forged line without its newline become a record the next signature vouches for.
                rel = self._save_torn(torn)
                os.ftruncate(fd, good_end)
                os.fsync(fd)
                self._append_locked(fd, "repair", _repair_fields(rel, torn, "torn last line moved aside"))
                self._recorded_torn.add(rel)
        # A crash between saving torn bytes and recording the repair leaves a torn
        # file no repair record names: record it now so it is never unaccounted for.
        unknown = [p for p in sorted(self.dir.glob(TORN_GLOB)) if f"{LEDGER_DIR}/{p.name}" not in self._recorded_torn]
        if unknown:  # read the records only when a torn file is new to this object
            self._recorded_torn |= {r.get("torn_file") for r in self.records() if r.get("kind") == "repair"}
            for p in unknown:
                rel = f"{LEDGER_DIR}/{p.name}"
                if rel not in self._recorded_torn:
                    repaired = True
                    self._append_locked(fd, "repair", _repair_fields(rel, p.read_bytes(), "torn file found unrecorded"))
                    self._recorded_torn.add(rel)
        return repaired

    def quarantine_from(self, line: int, reason: str) -> dict:
        """Move lines `line`.. (bytes unchanged) to ledger/quarantine-<time>.jsonl and append a
        "repair" record naming that file, its size and sha256 (`porter repair`, for a tampered tail)."""
        with self._locked() as fd:
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            lines = data.split(b"\n")
            cut = sum(len(x) + 1 for x in lines[: line - 1])
            moved = data[cut:]
            stamp = utc_now().replace(":", "").replace("-", "")
            path = self.dir / f"quarantine-{stamp}.jsonl"
            path.write_bytes(moved)
            fsync_dir(self.dir)
            os.ftruncate(fd, cut)
            os.fsync(fd)
            rel = f"{LEDGER_DIR}/{path.name}"
            return self._append_locked(fd, "repair", {"reason": reason, "quarantined_file": rel,
                                                      "quarantined_from_line": line, "quarantined_bytes": len(moved),
                                                      "quarantined_sha256": sha256_bytes(moved)})

    def _save_torn(self, torn: bytes) -> str:
        stamp = utc_now().replace(":", "").replace("-", "")
        path = self.dir / f"torn-{stamp}.jsonl.part"
        n = 1
        while path.exists():
            path = self.dir / f"torn-{stamp}-{n}.jsonl.part"
            n += 1
        tfd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(tfd, torn)
            os.fsync(tfd)
        finally:
            os.close(tfd)
        fsync_dir(self.dir)
        return f"{LEDGER_DIR}/{path.name}"

    # ---- reading and verifying ---------------------------------------------

    def read_bytes(self) -> bytes:
        try:
            return read_regular(self.path, LEDGER_MAX_BYTES)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise PorterError(f"{LEDGER_DIR}/{LEDGER_FILE} is refused: {exc.strerror}", exit_code=3) from exc

    @contextmanager
    def reading(self):
        """Hold a shared lock on the ledger while reading it (and the witness): an append, which
        also moves the witness, waits until the reader is done, so the reader sees one instant."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            yield  # absent, or refused by read_bytes with its own message
            return
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def records(self) -> list[dict]:
        """Every readable record in file order (a torn tail is left out)."""
        out = []
        for line in _complete_lines(self.read_bytes()):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def verify(self) -> Integrity:
        return self.scan().integrity

    def scan(self, data: bytes | None = None) -> Scan:
        """Read and verify in one pass: records with line numbers, plus the Integrity verdict."""
        if data is None:
            data = self.read_bytes()
        return scan_bytes(data, self.key, self.public)


def scan_bytes(data: bytes, key: bytes | None, public=None) -> Scan:
    lines, parsed, torn = _split_records(data)
    w = _ChainWalk(all_seqs={r.get("seq") for r in parsed if r is not None})
    for i, (line, rec) in enumerate(zip(lines, parsed), 1):
        w.line(i, line, rec, key)
    _hmac_verdict(w, key, public)
    fp = _signature_verdict(w, public) if public is not None else None
    if public is None and w.sig_lines:
        w.problems.append(f"{len(w.sig_lines)} records are signed but the workspace names no signing key "
                          "(ledger/signer.pub removed?)")
    keyed = key is not None and not any("HMAC" in p for p in w.problems) and (w.signed > 0 or not w.entries)
    integ = Integrity(
        ok=not w.problems,
        problems=w.problems,
        keyed=keyed,
        records=len(w.entries),
        signed=w.signed,
        key_given=key is not None,
        notes=w.notes,
        bad_lines=w.bad,
        first_signed_line=w.first_signed,
        fingerprint=fp,
        sig_signed=len(w.sig_lines),
        first_sig_line=w.sig_lines[0] if w.sig_lines else None,
        torn=torn,
    )
    return Scan(w.entries, integ, data)


def _split_records(data: bytes) -> tuple[list[bytes], list[dict | None], list[str]]:
    """(lines, each line's record or None, what is torn): a tail without a newline, or an unreadable last
    line, is what a crash mid-write leaves -- named, never read as a record."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    torn: list[str] = []
    if tail:
        torn.append(f"torn tail: {len(tail)} bytes after line {len(lines)} without a newline (never read as a "
                    "record; the next `porter run` or `porter repair` moves it aside)")
    parsed: list[dict | None] = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        parsed.append(rec if isinstance(rec, dict) else None)
    if parsed and parsed[-1] is None and not tail:
        torn.append(f"torn tail: line {len(lines)} is unreadable (the next `porter run` or `porter repair` "
                    "moves it aside)")
        lines.pop()
        parsed.pop()
    return lines, parsed, torn


@dataclass
class _ChainWalk:
    """The ledger read line by line: each line against the one before it (hash, chain, seq, HMAC chain,
    signature presence), and what was found."""
    all_seqs: set
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    bad: dict = field(default_factory=dict)
    entries: list = field(default_factory=list)
    chained: set = field(default_factory=set)  # lines whose prev is the sha256 of the line before
    hmac_bad: list = field(default_factory=list)
    sig_lines: list = field(default_factory=list)
    prev_line: bytes | None = None
    prev_seq: int = 0
    prev_hmac: str = ZERO
    prev_edited: bool = False
    signed: int = 0
    first_signed: int | None = None

    def problem(self, lineno: int, text: str) -> None:
        self.problems.append(text)
        self.bad.setdefault(lineno, text)

    def line(self, i: int, line: bytes, rec: dict | None, key: bytes | None) -> None:
        if rec is None:
            self.problem(i, f"line {i} is not a ledger record (unreadable)")
            self.prev_line, self.prev_edited = line, True
            return
        self.entries.append((i, rec))
        edited = self._hashed(i, line, rec)
        self._chain(i, rec)
        self._keyed(i, rec, key)
        self.prev_hmac = rec.get("hmac") if isinstance(rec.get("hmac"), str) else ZERO
        self.prev_line, self.prev_edited = line, edited
        if isinstance(rec.get("seq"), int):
            self.prev_seq = rec["seq"]

    def _hashed(self, i: int, line: bytes, rec: dict) -> bool:
        """Whether the line was edited (its hash no longer its own); a duplicated member is named too."""
        body = _line_body(line, rec)
        edited = rec.get("hash") != (sha256_bytes(body) if body is not None else record_hash(rec))
        if edited:
            self.problem(i, f"line {i} edited (hash mismatch; {_describe(rec)})")
        elif body is None or (rec.get("sig") is None and rec.get("hmac") is None):
            # A line whose hash checks over its own bytes, cut once around hash/hmac/sig, and that carries a
            # signature, holds what porter's writer hashed: canonical JSON, no member twice. Only the others
            # (hash recomputed over the parsed record, or nobody's signature) need the strict, 2x slower parse.
            try:
                loads_strict(line)
            except DuplicateMember as exc:
                self.problem(i, f"line {i} has a duplicated member {str(exc)!r} (JSON readers would disagree on "
                                "its value)")
        return edited

    def _chain(self, i: int, rec: dict) -> None:
        seq, prev_seq = rec.get("seq"), self.prev_seq
        expected_prev = sha256_bytes(self.prev_line) if self.prev_line is not None else ZERO
        if rec.get("prev") == expected_prev:
            self.chained.add(i)
            if not isinstance(seq, int) or seq != prev_seq + 1:
                self.problem(i, f"line {i} has seq {seq} after {prev_seq} (chain recomputed around a deleted or "
                                "inserted line)")
        elif self.prev_edited:
            pass  # the previous line's edit already explains this break
        elif isinstance(seq, int) and seq > prev_seq + 1:
            missing = range(prev_seq + 1, seq)
            if any(m in self.all_seqs for m in missing):
                self.problem(i, f"line {i} out of order (seq {seq} after {prev_seq}: lines reordered)")
            else:
                span = f"{missing[0]}" if len(missing) == 1 else f"{missing[0]}-{missing[-1]}"
                self.problem(i, f"record seq {span} deleted before line {i}")
        elif isinstance(seq, int) and seq <= prev_seq:
            self.problem(i, f"line {i} out of order (seq {seq} after {prev_seq}: lines reordered or inserted)")
        else:
            self.problem(i, f"line {i} does not chain to line {i - 1} (line {i - 1} rewritten with a recomputed "
                            f"hash, or a line inserted; {_describe(rec)})")

    def _keyed(self, i: int, rec: dict, key: bytes | None) -> None:
        rec_hmac, rec_hash = rec.get("hmac"), rec.get("hash")
        if rec_hmac is not None:
            self.signed += 1
            if self.first_signed is None:
                self.first_signed = i
        if rec_hmac is None and self.first_signed is not None:
            # visible without the key: a keyed ledger does not go back to unsigned lines
            self.problem(i, f"line {i} has no HMAC after signed records (appended without the key; {_describe(rec)})")
        elif key is not None and rec_hmac is not None:
            if not isinstance(rec_hash, str) or not hmac_mod.compare_digest(
                str(rec_hmac), chain_hmac(key, self.prev_hmac, rec_hash)
            ):
                self.hmac_bad.append((i, f"line {i} HMAC mismatch (written or altered without the key; "
                                         f"{_describe(rec)})"))
        if rec.get("sig") is not None:
            self.sig_lines.append(i)
        elif self.sig_lines:
            self.problem(i, f"line {i} is not signed after signed records (appended without the signing key, "
                            f"or its signature stripped; {_describe(rec)})")


def _hmac_verdict(w: _ChainWalk, key: bytes | None, public) -> None:
    if w.hmac_bad and len(w.hmac_bad) == w.signed:
        w.problems.append(f"wrong HMAC key: none of the {w.signed} HMAC-signed records verifies with the key given "
                          f"(check PORTER_LEDGER_KEY / the key file)")
    else:
        for i, text in w.hmac_bad:
            w.problem(i, text)
    if key is not None and w.entries and w.signed == 0 and public is None:
        w.problems.append(f"a ledger key is set but none of the {len(w.entries)} records carries an HMAC "
                          "(HMACs stripped and the chain recomputed, or a key set for another ledger)")
    if key is not None and w.first_signed is not None and w.first_signed > 1:
        w.notes.append(f"lines 1-{w.first_signed - 1} predate the HMAC key (covered by the chain into line "
                       f"{w.first_signed})")


def _signature_verdict(w: _ChainWalk, public) -> str:
    """The signing key's fingerprint, with every signature problem added to the walk's."""
    from porter.records import signing

    fp = signing.fingerprint(public)
    by_line = dict(w.entries)
    if w.entries and not w.sig_lines:
        w.problems.append(f"the workspace's signing key is {fp} but none of the {len(w.entries)} records is signed "
                          "(signatures stripped and the chain recomputed?)")
    elif w.sig_lines:
        failed = _unverified(w.sig_lines, by_line, w.chained, public)
        if len(failed) == len(w.sig_lines):
            w.problems.append(f"no signed record verifies with the workspace's key {fp} "
                              f"(ledger/signer.pub swapped, or every record forged)")
        for i in failed if len(failed) < len(w.sig_lines) else []:
            w.problem(i, f"line {i} signature does not verify with {fp} (forged, or signed with another key; "
                         f"{_describe(by_line[i])})")
        if w.sig_lines[0] > 1:
            w.notes.append(f"lines 1-{w.sig_lines[0] - 1} predate the signing key (covered by the chain into line "
                           f"{w.sig_lines[0]})")
    return fp


def _unverified(sig_lines: list[int], by_line: dict, chained: set[int], public) -> list[int]:
    """Signed lines whose signature does not verify. Walking back from the last: a genuine record
    with prev_checked, chained to the line before it, vouches for that line's signature (its writer
    checked it), so only lines nobody vouches for cost an Ed25519 check (see the module docstring)."""
    from porter.records import signing

    failed = []
    vouched = None
    for i in reversed(sig_lines):
        rec = by_line[i]
        good = i == vouched or signing.verify(public, rec.get("hash"), rec.get("sig"))
        if not good:
            failed.append(i)
        vouched = i - 1 if good and rec.get("prev_checked") is True and i in chained else None
    return failed[::-1]


def _describe(rec: dict) -> str:
    parts = [f"seq {rec.get('seq')}", str(rec.get("kind"))]
    if rec.get("unit"):
        parts.append(str(rec["unit"]))
    if rec.get("attempt") is not None:
        parts.append(f"attempt {rec['attempt']}")
    return " ".join(parts)


def _repair_fields(rel: str, torn: bytes, reason: str) -> dict:
    return {"reason": reason, "torn_file": rel, "torn_bytes": len(torn), "torn_sha256": sha256_bytes(torn)}


def _complete_lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    lines.pop()  # the torn tail, or b"" after the final newline
    return lines


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _tail_bytes(fd: int, size: int, want_lines: int) -> tuple[int, bytes]:
    """At least `want_lines` newline-separated pieces from the end: (offset, bytes)."""
    chunk = 65536
    start = size
    buf = b""
    while start > 0:
        step = min(chunk, start)
        start -= step
        buf = os.pread(fd, step, start) + buf
        if buf.count(b"\n") > want_lines:
            break
        chunk *= 2
    return start, buf


def _last_line(fd: int) -> bytes | None:
    """The last complete line (without its newline), or None for an empty ledger."""
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    start, buf = _tail_bytes(fd, size, 1)
    body = buf[:-1] if buf.endswith(b"\n") else buf
    nl = body.rfind(b"\n")
    return body[nl + 1 :] if nl >= 0 else body


def _torn_tail(fd: int, size: int) -> tuple[int, bytes | None]:
    """(offset where the intact ledger ends, torn bytes) or (size, None) when the tail is whole."""
    start, buf = _tail_bytes(fd, size, 1)
    if not buf.endswith(b"\n"):
        nl = buf.rfind(b"\n")
        cut = start + nl + 1 if nl >= 0 else 0  # no newline read means start == 0: all torn
        return cut, buf[cut - start :]
    body = buf[:-1]
    nl = body.rfind(b"\n")
    last = body[nl + 1 :]
    try:
        rec = json.loads(last)
        if isinstance(rec, dict):
            return size, None
    except ValueError:
        pass
    cut = start + nl + 1
    return cut, buf[cut - start :]
