"""Every tuning table (iris_fw/tuning/*.json) follows the one envelope and is read by the one
loader (iris_fw.tuning); a table that does not raises naming the file and the key."""

import pytest
import torch

from iris_fw import tuning
from iris_fw.tuning import TuningTableError


@pytest.mark.parametrize("name", tuning.TABLES)
def test_every_table_loads_with_the_envelope(name):
    data = tuning.load(name)
    assert isinstance(data["_doc"], str) and data["_doc"]
    assert isinstance(data["defaults"], dict) and isinstance(data["devices"], dict)


@pytest.mark.parametrize("bad,says", [
    ({"defaults": {}, "devices": {}}, "'_doc' must be a str"),
    ({"_doc": "x", "devices": {}}, "'defaults' must be a dict"),
    ({"_doc": "x", "defaults": {}, "devices": {}, "_note": 3}, "note '_note' must be a string"),
    ({"_doc": "x", "defaults": {"cuda": [[-1, "a"]]}, "devices": {}}, "defaults.cuda: a row must be"),
    ({"_doc": "x", "defaults": {}, "devices": {"GPU": [[16, "a", "b"]]}}, "devices.GPU: a row must be"),
])
def test_a_bad_table_raises_naming_file_and_key(bad, says):
    with pytest.raises(TuningTableError, match="iris_fw/tuning/moe.json") as info:
        tuning.check("moe", bad)
    assert says in str(info.value)


def test_unknown_table_is_named():
    with pytest.raises(TuningTableError, match="no tuning table 'nope'"):
        tuning.load("nope")


def test_rows_device_name_overrides_defaults_and_first_bound_applies():
    data = {"_doc": "x", "defaults": {"cpu": [[8, "small"], [None, "big"]], "all_reduce": [[None, ["a"]]]},
            "devices": {"GPU X": [[4, "x"]], "GPU Y": {"2": {"all_reduce": [[100, ["b", "a"]], [None, ["a"]]]}}}}
    tuning.check("moe", data)
    assert tuning.bounded(tuning.device_rows(data, "CPU", "cpu"), 8) == "small"
    assert tuning.bounded(tuning.device_rows(data, "CPU", "cpu"), 9) == "big"
    assert tuning.bounded(tuning.device_rows(data, "GPU X", "cuda"), 100) == "x"  # past the last bound: the last row
    assert tuning.bounded(tuning.device_rows(data, "GPU Y", "cuda", world_size=2, entry="all_reduce"), 50) == ["b", "a"]
    assert tuning.device_rows(data, "GPU Y", "cuda", world_size=3, entry="all_reduce") == [[None, ["a"]]]
    assert tuning.device_rows(data, "GPU Z", "cuda") is None


def test_the_callers_read_through_the_loader():
    from iris_fw import gemm, moe
    from iris_fw.ccl import algorithm

    class Ctx:
        device = torch.device("cpu")

    assert algorithm.auto_order(Ctx(), 2, "all_gather", 1024) == ["push", "pull"]
    assert moe.auto_mode(torch.device("cpu"), 1) in ("low_latency", "throughput")
    assert gemm.measured_config(16, torch.device("cpu")) is None  # measured rows are per GPU name


def test_every_device_row_makes_its_configuration(monkeypatch):
    """Each measured device row of the GEMM, flash-decode and MoE-GEMM tables builds the
    configuration its reader makes — notes (``measured``) left out — so a row pasted from a
    GPU sweep cannot break that GPU's calls (run 30: a flash-decode row's ``measured`` note made
    every flash_decode call on the H100 raise ``TypeError``)."""
    from iris_fw import devinfo, flash_decode, gemm, moe_gemm

    for table, read in (("gemm", lambda dev: gemm._measured_rows(dev.name)),
                        ("flash_decode", lambda dev: flash_decode.tuning(torch.device("cuda"), 128)),
                        ("moe_gemm", lambda dev: moe_gemm.tile_config(torch.device("cuda")))):
        for name in tuning.load(table)["devices"]:
            dev = devinfo.DeviceInfo(**{**devinfo.info(torch.device("cpu")).__dict__, "name": name, "type": "cuda"})
            monkeypatch.setattr(devinfo, "info", lambda device, dev=dev: dev)
            assert read(dev), (table, name)
