"""Evidence files: content-addressed, canonical, refused when edited or swapped."""

from __future__ import annotations

import hashlib
import json

import pytest

from porter.errors import PorterError
from porter.records.evidence import check_evidence, evidence_path, load_evidence, store_evidence


def ev(unit="mini_gpu_add_tensor", **more):
    return {"target": "minimoe", "unit": unit, "gate": "parity", "ok": True,
            "candidate_sha256": "ab" * 32, "toolchain": {"nvcc": "12.4"}, **more}


def test_store_is_content_addressed_and_canonical(tmp_path):
    sha = store_evidence(tmp_path, ev(seeds=[1, 2]))
    path = tmp_path / "ledger" / "evidence" / f"{sha}.json"
    body = path.read_bytes()
    assert hashlib.sha256(body).hexdigest() == sha
    assert body == json.dumps(ev(seeds=[1, 2]), sort_keys=True, separators=(",", ":")).encode()
    # key order does not matter; storing twice is a no-op
    reordered = dict(reversed(list(ev(seeds=[1, 2]).items())))
    assert store_evidence(tmp_path, reordered) == sha
    assert load_evidence(tmp_path, sha) == ev(seeds=[1, 2])
    assert [p.name for p in path.parent.iterdir()] == [f"{sha}.json"]  # no temp files left


def test_required_fields(tmp_path):
    bad = ev()
    del bad["candidate_sha256"]
    with pytest.raises(ValueError):
        store_evidence(tmp_path, bad)


def test_edited_evidence_refused(tmp_path):
    sha = store_evidence(tmp_path, ev())
    path = evidence_path(tmp_path, sha)
    path.write_bytes(path.read_bytes().replace(b'"ok":true', b'"ok":false'))
    with pytest.raises(PorterError) as exc:
        load_evidence(tmp_path, sha)
    assert exc.value.exit_code == 3 and "edited or swapped" in str(exc.value)
    assert check_evidence(tmp_path, sha)[0] is None


def test_swapped_evidence_refused(tmp_path):
    a = store_evidence(tmp_path, ev("mini_gpu_add_tensor"))
    b = store_evidence(tmp_path, ev("mini_gpu_swiglu_tensor"))
    evidence_path(tmp_path, a).write_bytes(evidence_path(tmp_path, b).read_bytes())
    data, problem = check_evidence(tmp_path, a)
    assert data is None and "edited or swapped" in problem and b[:12] in problem


def test_missing_and_malformed_ids(tmp_path):
    with pytest.raises(PorterError, match="missing"):
        load_evidence(tmp_path, "0" * 64)
    with pytest.raises(PorterError):
        evidence_path(tmp_path, "../../etc/passwd")
    assert "not a sha256" in check_evidence(tmp_path, "../x")[1]
