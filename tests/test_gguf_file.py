"""A model path that is a directory, another format or a download cut short gets one line saying so,
not "does not exist" or numpy's "When changing to a larger dtype ..."."""

from __future__ import annotations

import numpy as np
import pytest

from porter.errors import PorterError
from porter.spec.weights import ModelFile, WeightsError
from porter.target.scan.census import read_header


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    import gguf

    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.arange(4096, dtype=np.float32).reshape(64, 64))
    w.add_tensor("output.weight", np.ones((64, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cut(src, dst, n: int):
    dst.write_bytes(src.read_bytes()[:n])
    return dst


def test_a_directory_is_named_as_one(tmp_path, small_gguf):
    for read in (read_header, ModelFile):
        with pytest.raises(PorterError, match="is a directory, not a GGUF file"):
            read(tmp_path)


def test_a_missing_file_and_another_format(tmp_path):
    with pytest.raises(PorterError, match="does not exist"):
        read_header(tmp_path / "nope.gguf")
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00{}")
    with pytest.raises(PorterError, match=r"is not a GGUF file \(it starts with"):
        read_header(tmp_path / "model.safetensors")


def test_a_header_cut_short_is_truncated_not_a_numpy_error(tmp_path, small_gguf):
    short = cut(small_gguf, tmp_path / "short.gguf", 100)
    for read in (read_header, ModelFile):
        with pytest.raises(PorterError) as ei:
            read(short)
        msg = str(ei.value)
        assert "truncated or damaged GGUF" in msg and "100 bytes" in msg and "larger dtype" not in msg


def test_tensor_data_cut_short_is_refused_where_the_data_is_read_and_enough_for_the_census(tmp_path, small_gguf):
    size = small_gguf.stat().st_size
    short = cut(small_gguf, tmp_path / "short.gguf", size - 1000)
    with pytest.raises(WeightsError, match=r"is a truncated or damaged GGUF file \([\d,]+ bytes"):
        ModelFile(short)
    assert ModelFile(small_gguf).tensors  # the whole file reads
    _arch, tensors, header_only = read_header(short)  # the census needs the header only, and says so
    assert header_only and len(tensors) == 2


def test_plan_says_it_in_one_line(tmp_path, porter_cli, workspace):
    r = porter_cli(workspace, "plan", "--model", str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"porter: error: model file {tmp_path} is a directory, not a GGUF "
                                             f"file: name the .gguf file inside it"]
