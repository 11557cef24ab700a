"""The device a local model answers on (pipeline/llm/devices.py): `auto` resolves, a device torch names and this
machine has passes as given, anything else is one line naming the setting, before a model loads. On this machine's
CPU build the CUDA refusals are checked; where torch sees a GPU, the count is."""

import pytest
import torch

from pipeline.errors import UserFixableError
from pipeline.llm.devices import resolve_device


def test_auto_is_a_gpu_where_torch_sees_one_else_the_cpu():
    assert resolve_device("auto", "--device") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu", "--device") == "cpu"


@pytest.mark.parametrize("choice", ["tpu", "gpu", "cuda:x", ""])
def test_a_name_torch_does_not_know_is_refused_naming_the_setting(choice):
    with pytest.raises(UserFixableError, match=rf"^evaluate.predictor.device is `{choice}`: not a device torch names"):
        resolve_device(choice, "evaluate.predictor.device")


def test_a_gpu_this_machine_lacks_is_refused_with_what_it_has():
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        with pytest.raises(
            UserFixableError, match=r"^--device is `cuda:1`: this machine has no CUDA GPU torch can use"
        ):
            resolve_device("cuda:1", "--device")
    else:
        assert resolve_device("cuda:0", "--device") == "cuda:0"
        with pytest.raises(UserFixableError, match=rf"this machine has {count} CUDA GPU\(s\)"):
            resolve_device(f"cuda:{count}", "--device")
