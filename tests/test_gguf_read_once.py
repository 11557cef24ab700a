"""The GGUF conversion's shared reads (pipeline/training/gguf_base.py, `_gguf_read_once`): one parse of a file
however often transformers asks, the same fields and tensors as gguf's own reader, and gguf's names put back
afterwards, also when the conversion fails. On a small GGUF file written here with gguf's writer; the packaged
model's conversion through it is tests/test_real_model.py's, and bench/gguf_conversion.py checks that it writes
the same folder byte for byte as transformers' own reads."""

import gguf
import numpy as np
import pytest

from pipeline.training.gguf_base import _gguf_read_once


@pytest.fixture
def small_gguf(tmp_path):
    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_token_list([f"token{i}" for i in range(300)])
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_one_parse_the_same_fields_and_tensors_and_the_names_put_back(small_gguf):
    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    own = original_reader(small_gguf)
    with _gguf_read_once():
        first = gguf.GGUFReader(small_gguf)
        assert gguf.GGUFReader(str(small_gguf)) is first
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (original_reader, original_map)
    assert list(first.fields) == list(own.fields)
    for name, field in own.fields.items():
        assert [part.tolist() for part in first.fields[name].parts] == [part.tolist() for part in field.parts], name
    assert [t.name for t in first.tensors] == ["token_embd.weight"]
    assert np.array_equal(first.tensors[0].data, own.tensors[0].data)
    assert not isinstance(first.data, np.memmap)


def test_the_names_are_put_back_when_the_conversion_fails(small_gguf):
    original_reader = gguf.GGUFReader
    with pytest.raises(ValueError), _gguf_read_once():
        raise ValueError("an architecture the loader does not read")
    assert gguf.GGUFReader is original_reader
